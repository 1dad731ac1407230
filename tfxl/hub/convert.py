"""From a trained tfxl model to a `TransfoXLCausalLM` (then `save_to_preset` for keras-hub)."""

from tfxl.hub.backbone import TransfoXLHubBackbone
from tfxl.hub.causal_lm import TransfoXLCausalLM
from tfxl.hub.preprocessor import TransfoXLCausalLMPreprocessor
from tfxl.hub.tokenizer import TransfoXLTokenizer


def causal_lm_from_model(model, tokenizer=None, sequence_length=1024, mem_len=None):
    """A `TransfoXLCausalLM` with the weights of `model` (a built `tfxl.models.TransfoXLLM`).

    tokenizer: the tfxl tokenizer the model was trained with (None: no preprocessor, generate
      then takes token ids). sequence_length: the preprocessor's default max_length. mem_len:
      generation's memory length (default the config's eval_mem_len). The weights are copied:
      the result does not share them.
    """
    if not model.built:
        raise ValueError("the model has no weights yet: build or load it first")
    backbone = TransfoXLHubBackbone(model.config, attention_cls=model.attention_cls,
                                    dtype=model.dtype_policy)
    backbone.language_model.set_weights(model.get_weights())
    preprocessor = None
    if tokenizer is not None:
        if tokenizer.vocab_size != model.config.vocab_size:
            raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids, the model "
                             f"{model.config.vocab_size}")
        preprocessor = TransfoXLCausalLMPreprocessor(
            TransfoXLTokenizer.from_tfxl(tokenizer), sequence_length=sequence_length)
    return TransfoXLCausalLM(backbone, preprocessor, mem_len=mem_len)


def causal_lm_from_model_dir(source, data_dir=None, checkpoint=None, **kwargs):
    """`causal_lm_from_model` of a `.keras` file or a tfxl-train model_dir (its newest readable
    checkpoint, or `checkpoint`), with the tokenizer of the tfxl-prepare `data_dir` checked to be
    the model's vocabulary (as tfxl-generate checks it). kwargs: see `causal_lm_from_model`."""
    from tfxl.checkpoints.loading import load_checked_tokenizer, load_language_model
    model = load_language_model(source, checkpoint)
    tokenizer = None
    if data_dir is not None:
        tokenizer = load_checked_tokenizer(data_dir, source, model.config.vocab_size)
    return causal_lm_from_model(model, tokenizer, **kwargs)

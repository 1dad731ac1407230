"""Scoring whole documents: every token's NLL given all the tokens before it, in one loop.

Shape glossary: B batch, S document length (tokens, S >= 2), T segment length, M memory length.

`keras.ops` only, so it runs on every backend: the segments are read by `ops.while_loop`
(TensorFlow's tf.while_loop, in-graph with a tensor S, as the SavedModel signatures call it;
JAX's lax.while_loop; a Python loop on PyTorch) into a preallocated NLL buffer.
"""

from keras import ops


def score_document(model, token_ids, target_mask=None, tgt_len=None, mem_len=None,
                   clamp_len=None, same_length=None):
    """Per-token NLL of documents `token_ids` int [B, S]: nll[:, t] = -log p(token t+1 | <= t).

    Reads each document as Transformer-XL evaluation does: segments of T tokens, each attending
    to the key/value memory of the last M positions (a `KeyValueRing`: each segment's keys
    and values written over the oldest, in place where the loop compiles), carried by one loop
    (`ops.while_loop`: in-graph on TensorFlow, so a SavedModel serves a whole document per
    request, and S may be unknown until it runs; on JAX S is static, as every shape is there,
    and the loop is lax.while_loop, eagerly too). The position keys of K = M + T are computed
    once, before the loop. The last segment is right-padded to T; its padded targets are
    dropped.

    target_mask: optional [B, S - 1], bool or float (0 = not counted), e.g. False at the right
      padding of rows of different lengths. It only selects targets: every input is still read,
      so a row's counted NLLs do not depend on its masked ones (right padding comes after all of
      a row's tokens and no query attends to a later position).
    tgt_len, mem_len, clamp_len, same_length: default to `model.config.eval_settings()`.
    Returns:
      (nll float32 [B, S - 1], 0 where not counted; mask bool [B, S - 1], the counted targets).
    """
    settings = model.config.eval_settings(tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                                          same_length=same_length)
    tgt_len, mem_len = settings["tgt_len"], settings["mem_len"]
    clamp_len, same_length = settings["clamp_len"], settings["same_length"]
    token_ids = ops.cast(token_ids, "int32")
    if len(token_ids.shape) != 2 or (token_ids.shape[1] is not None and token_ids.shape[1] < 2):
        raise ValueError(f"token_ids must be [B, S] with S >= 2 (S - 1 targets), got shape "
                         f"{tuple(token_ids.shape)}")
    batch, num_targets = ops.shape(token_ids)[0], ops.shape(token_ids)[1] - 1
    mask = (ops.ones((batch, num_targets), "bool") if target_mask is None
            else ops.not_equal(ops.cast(target_mask, "float32"), 0.0))
    num_segments = (num_targets + tgt_len - 1) // tgt_len

    def segments(x):  # [B, S - 1] -> [B, segments, T], the last one right-padded with id 0
        x = ops.pad(x, [[0, 0], [0, num_segments * tgt_len - num_targets]])
        return ops.reshape(x, (batch, num_segments, tgt_len))

    inputs, targets = segments(token_ids[:, :-1]), segments(token_ids[:, 1:])
    run = dict(clamp_len=clamp_len, same_length=same_length,
               position_keys=model.position_keys(mem_len + tgt_len, clamp_len))

    def body(step, memory, nll):
        step_nll, memory = model(inputs[:, step], memory, targets=targets[:, step], **run)
        step_nll = ops.expand_dims(ops.cast(step_nll, "float32"), 1)
        return step + 1, memory, ops.slice_update(nll, (0, step, 0), step_nll)

    _, _, nll = ops.while_loop(
        lambda step, *_: step < num_segments, body,
        (ops.convert_to_tensor(0, "int32"), model.init_key_value_ring(batch, tgt_len, mem_len),
         ops.zeros((batch, num_segments, tgt_len), "float32")))
    nll = ops.reshape(nll, (batch, num_segments * tgt_len))[:, :num_targets]
    return ops.where(mask, nll, 0.0), mask

"""Training the language model with plain `model.fit`, memory carried across batches.

Shape glossary: B batch (streams; fixed), T segment length, L layers, M memory length
(config.mem_len), K = M + T keys, D model size, N heads, H head size, V vocabulary size.

`fit` trains on the layer-input memory: W_k and W_v learn through the memory rows they project.
`evaluate` and `predict` (test_step, predict_step) keep a key/value memory instead: the weights
are fixed while they run, so each step projects only its T new rows, and the position keys
(W_k,R R, which depend on the weights, K and clamp_len only) are computed once at their start and
read from a variable by every step.
"""

import keras
import tensorflow as tf

from tfxl.layers.memory import VALID
from tfxl.models.backbone import as_config
from tfxl.models.language_model import TransfoXLLM

POSITION_KEYS = "position_keys"


class _Hidden:
    """Named tf.Variables held out of Keras' sight: not weights, not saved in .keras files."""

    def __init__(self, name, **initial_values):
        self.variables = {key: tf.Variable(value, trainable=False, name=f"{name}_{key}")
                          for key, value in initial_values.items()}

    def read(self):
        return {key: variable.value() for key, variable in self.variables.items()}

    def write(self, values):
        for key, variable in self.variables.items():
            variable.assign(tf.cast(values[key], variable.dtype))


def _clear(memory):
    """Marks every slot of a held memory empty; the model never attends to such slots."""
    valid = memory.variables[VALID]
    valid.assign(tf.zeros_like(valid))


@keras.saving.register_keras_serializable(package="tfxl")
class StatefulTransfoXLLM(keras.Model):
    """A TransfoXLLM whose memory lives between `fit`/`evaluate` batches, for Keras users.

    Feed batches in stream order (no shuffling): row b of every batch must continue row b of the
    previous one, as `tfxl.data.pipeline.input_fn` produces. Data: x = token ids [B, T] or a dict
    {"inputs": [B, T], "reset": [B]} (reset clears a row's memory first, e.g. at stream starts),
    y = next tokens [B, T], optional sample_weight = target mask [B, T]. The loss is the
    token-weighted NLL from the adaptive softmax (no [B, T, V] logits); `predict` returns log-probs.
    The memory is a non-trainable state variable of B rows and M = config.mem_len slots, excluded
    from `trainable_weights`, from `weights` and from `.keras` files; `reset_memory()` clears it.
    `evaluate`/`predict` (and fit's validation) carry their own key/value memory, cleared at their
    start; `test_on_batch`/`predict_on_batch` continue it. Segments of config.tgt_len tokens reuse
    position keys computed when those start; other lengths compute theirs in each step.
    `evaluate`/`predict` run with the training settings (mem_len, clamp_len, same_length; the
    batches' own segment length), not `config.eval_settings()`: in Keras' sense they are fit's
    validation on the same streams, and the memory variable has config.mem_len slots. tfxl-eval,
    export, scoring and generation use the evaluation settings.
    """

    def __init__(self, config, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.config = as_config(config)
        self.batch_size = int(batch_size)
        self.lm = TransfoXLLM(self.config, name="lm")
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def build(self, ids_shape=None):
        c = self.config
        self.lm.build((self.batch_size, c.tgt_len))
        # Training carries one memory across fit() batches (and epochs); evaluate() and predict()
        # use their own, cleared at their start, so validation never leaks into training.
        self._memory = _Hidden("memory", **self.lm.init_memory(self.batch_size))
        self._eval_memory = _Hidden(
            "eval_memory", **self.lm.init_key_value_memory(self.batch_size, mem_len=c.mem_len))
        # [L, N, H, K + 1] for segments of tgt_len tokens; recomputed by _start_inference().
        self._position_keys = _Hidden("eval", **{POSITION_KEYS: self._current_position_keys()})
        self.built = True

    def _current_position_keys(self):
        c = self.config
        keys = self.lm.position_keys(c.mem_len + c.tgt_len)
        return tf.stack(keys, axis=0)

    def reset_memory(self):
        """Clears the training memory (e.g. before fitting on another set of streams)."""
        if self.built:
            _clear(self._memory)

    # -- evaluation and prediction: every entry point to test_step/predict_step ---------------
    def _start_inference(self, new_pass):
        """Position keys for the weights as they are now (fit may have changed them since) and,
        for a new evaluate()/predict() pass, an empty key/value memory."""
        if not self.built:
            self.build()
        if new_pass:
            _clear(self._eval_memory)
        self._position_keys.write({POSITION_KEYS: self._current_position_keys()})

    def evaluate(self, *args, **kwargs):
        self._start_inference(new_pass=True)
        return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        self._start_inference(new_pass=True)
        return super().predict(*args, **kwargs)

    def test_on_batch(self, *args, **kwargs):
        self._start_inference(new_pass=False)
        return super().test_on_batch(*args, **kwargs)

    def predict_on_batch(self, *args, **kwargs):
        self._start_inference(new_pass=False)
        return super().predict_on_batch(*args, **kwargs)

    # -- steps --------------------------------------------------------------------------------
    def _split(self, x):
        if isinstance(x, dict):
            return x["inputs"], x.get("reset")
        return x, None

    def _run(self, x, targets, training, position_keys=None):
        """One segment: the training memory when training, else the key/value memory."""
        if not self.built:  # fit calls train_step without __call__
            self.build()
        ids, reset = self._split(x)
        tf.debugging.assert_equal(tf.shape(ids)[0], self.batch_size, message=(
            f"StatefulTransfoXLLM was built for batch_size={self.batch_size} streams; batch the "
            "data with exactly that many rows (drop_remainder=True)"))
        state = self._memory if training else self._eval_memory
        output, new_memory = self.lm(ids, state.read(), reset=reset, targets=targets,
                                     training=training, position_keys=position_keys)
        state.write(new_memory)
        return output

    def _inference_step(self, x, targets):
        """test_step/predict_step: the position keys of `_start_inference` when the segment has
        the config.tgt_len tokens they were computed for (None: the call computes them)."""
        ids, _ = self._split(x)
        position_keys = None
        if ids.shape[1] == self.config.tgt_len:
            position_keys = tf.unstack(self._position_keys.read()[POSITION_KEYS], axis=0)
        return self._run(x, targets, training=False, position_keys=position_keys)

    def call(self, x, training=None):
        # Direct calls may follow a weight change that no _start_inference() saw: the call
        # computes its own position keys.
        return self._run(x, None, training)

    def _loss(self, nll, sample_weight):
        weight = tf.ones_like(nll) if sample_weight is None else tf.cast(sample_weight, nll.dtype)
        return tf.reduce_sum(nll * weight) / tf.maximum(tf.reduce_sum(weight), 1.0)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            loss = self._loss(self._run(x, y, True), sample_weight)
            scaled = self.optimizer.scale_loss(loss)
        variables = self.lm.trainable_variables
        self.optimizer.apply(tape.gradient(scaled, variables), variables)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    def test_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        self.loss_tracker.update_state(self._loss(self._inference_step(x, y), sample_weight))
        return {"loss": self.loss_tracker.result()}

    def predict_step(self, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        return self._inference_step(x, None)

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               **kwargs):
        """`TransfoXLLM.export` of the wrapped language model: the same stateless signatures,
        the memory on the wire. The memory held between batches is training state, not
        exported: concurrent serving requests must never share one."""
        self.lm.export(filepath, format, verbose, input_signature, **kwargs)

    @property
    def metrics(self):
        return [self.loss_tracker]

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "batch_size": self.batch_size}

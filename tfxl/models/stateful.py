"""Training the language model with plain `model.fit`, memory carried across batches.

Shape glossary: B batch (streams; fixed), T segment length, L layers, M memory length, D model
size, V vocabulary size.
"""

import keras
import tensorflow as tf

from tfxl.layers.memory import STATES, VALID
from tfxl.models.backbone import as_config
from tfxl.models.language_model import TransfoXLLM


class _Memory:
    """Holds the memory variables out of Keras' sight: not weights, not saved in .keras files."""

    def __init__(self, states, valid):
        self.states, self.valid = states, valid


@keras.saving.register_keras_serializable(package="tfxl")
class StatefulTransfoXLLM(keras.Model):
    """A TransfoXLLM whose memory lives between `fit`/`evaluate` batches, for Keras users.

    Feed batches in stream order (no shuffling): row b of every batch must continue row b of the
    previous one, as `tfxl.data.pipeline.input_fn` produces. Data: x = token ids [B, T] or a dict
    {"inputs": [B, T], "reset": [B]} (reset clears a row's memory first, e.g. at stream starts),
    y = next tokens [B, T], optional sample_weight = target mask [B, T]. The loss is the
    token-weighted NLL from the adaptive softmax (no [B, T, V] logits); `predict` returns log-probs.
    The memory is a non-trainable state variable of B rows, excluded from `trainable_weights`,
    from `weights` and from `.keras` files; `reset_memory()` clears it. `evaluate`/`predict`
    (and fit's validation) carry their own memory, cleared at their start.
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

        def memory(name):
            empty = self.lm.init_memory(self.batch_size)
            return _Memory(tf.Variable(empty[STATES], trainable=False, name=f"{name}_states"),
                           tf.Variable(empty[VALID], trainable=False, name=f"{name}_valid"))

        # Training carries one memory across fit() batches (and epochs); evaluate() and predict()
        # use their own, cleared at their start, so validation never leaks into training.
        self._memory, self._eval_memory = memory("memory"), memory("eval_memory")
        self.built = True

    def reset_memory(self):
        """Clears the training memory (e.g. before fitting on another set of streams)."""
        if self.built:
            self._memory.valid.assign(tf.zeros_like(self._memory.valid))

    def evaluate(self, *args, **kwargs):
        if self.built:
            self._eval_memory.valid.assign(tf.zeros_like(self._eval_memory.valid))
        return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        if self.built:
            self._eval_memory.valid.assign(tf.zeros_like(self._eval_memory.valid))
        return super().predict(*args, **kwargs)

    def _split(self, x):
        if isinstance(x, dict):
            return x["inputs"], x.get("reset")
        return x, None

    def _run(self, x, targets, training):
        if not self.built:  # fit/evaluate call train_step/test_step without __call__
            self.build()
        state = self._memory if training else self._eval_memory
        ids, reset = self._split(x)
        tf.debugging.assert_equal(tf.shape(ids)[0], self.batch_size, message=(
            f"StatefulTransfoXLLM was built for batch_size={self.batch_size} streams; batch the "
            "data with exactly that many rows (drop_remainder=True)"))
        memory = {STATES: state.states.value(), VALID: state.valid.value()}
        output, new_memory = self.lm(ids, memory, reset=reset, targets=targets,
                                     training=training)
        state.states.assign(tf.cast(new_memory[STATES], state.states.dtype))
        state.valid.assign(new_memory[VALID])
        return output

    def call(self, x, training=None):
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
        self.loss_tracker.update_state(self._loss(self._run(x, y, False), sample_weight))
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "batch_size": self.batch_size}

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

from tfxl.layers.memory import MemoryVariables
from tfxl.models.backbone import as_config, default_name
from tfxl.models.language_model import TransfoXLLM


class _Hidden:
    """A tf.Variable held out of sight: a plain object's attribute is tracked neither by Keras
    (not a weight, not in .keras files) nor by tf.train.Checkpoint / SavedModel."""

    def __init__(self, value, name):
        self.variable = tf.Variable(value, trainable=False, name=name)


@keras.saving.register_keras_serializable(package="tfxl")
class StatefulTransfoXLLM(keras.Model):
    """A TransfoXLLM whose memory lives between `fit`/`evaluate` batches, for Keras users.

    Feed batches in stream order (no shuffling: `fit` defaults to shuffle=False and refuses
    True): row b of every batch must continue row b of the previous one, as
    `tfxl.data.pipeline.input_fn` produces, and every batch has batch_size rows. Data: x = token
    ids [B, T] or a dict {"inputs": [B, T], "reset": [B]} (reset clears a row's memory first,
    e.g. at stream starts), y = next tokens [B, T], optional sample_weight = target mask [B, T].
    The loss is the token-weighted NLL from the adaptive softmax (no [B, T, V] logits); `predict`
    returns log-probs.
    Compiled metrics get (y, the per-token NLL [B, T], sample_weight): `tfxl.metrics`.
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

    def __init__(self, config, batch_size, name=None, **kwargs):
        super().__init__(name=name or default_name("stateful_transfo_xl_lm"), **kwargs)
        self.config = as_config(config)
        self.batch_size = int(batch_size)
        self.lm = TransfoXLLM(self.config, name="lm")
        self.build((self.batch_size, None))

    def build(self, ids_shape=None):
        if self.built:  # built by __init__; Keras may ask again (loading a .keras file)
            return
        # Training carries one memory across fit() batches (and epochs); evaluate() and predict()
        # use their own, cleared at their start, so validation never leaks into training.
        # MemoryVariables are plain objects: Keras tracks none of their variables (not weights,
        # not in .keras files).
        self._memory = MemoryVariables(self.lm.init_memory(self.batch_size), "memory")
        self._eval_memory = MemoryVariables(self.lm.init_key_value_memory(
            self.batch_size, mem_len=self.config.mem_len), "eval_memory")
        # [L, N, H, K + 1] for segments of tgt_len tokens; recomputed by _start_inference().
        self._position_keys = _Hidden(self._current_position_keys(), "eval_position_keys")

    def compute_output_shape(self, ids_shape):
        """log_probs [B, T, V] (`call` and `predict`)."""
        return self.lm.compute_output_shape(ids_shape)[0]

    def _current_position_keys(self):
        c = self.config
        keys = self.lm.position_keys(c.mem_len + c.tgt_len)
        return tf.stack(keys, axis=0)

    def reset_memory(self):
        """Clears the training memory (e.g. before fitting on another set of streams)."""
        self._memory.clear()

    # -- entry points: stream order and batch size -------------------------------------------
    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
            validation_split=0.0, validation_data=None, shuffle=False, **kwargs):
        """`keras.Model.fit` in stream order: shuffle defaults to False here, and any other value
        is refused (it would reorder the batches, and the rows of array input, so that row b of
        a batch no longer continues row b of the one before). Arrays are cut into batches of
        batch_size rows (the model's, the default here)."""
        if shuffle:
            raise ValueError(
                f"StatefulTransfoXLLM.fit: shuffle={shuffle!r} would break stream order (row b of "
                "each batch continues row b of the one before); pass shuffle=False, the default "
                "here")
        if isinstance(validation_data, (tuple, list)):  # arrays: checked now, not after an epoch
            self._array_batch_size(validation_data[0], kwargs.get("validation_batch_size"),
                                   "fit (validation_data)")
        return super().fit(x, y, batch_size=self._array_batch_size(x, batch_size, "fit"),
                           epochs=epochs, verbose=verbose, callbacks=callbacks,
                           validation_split=validation_split, validation_data=validation_data,
                           shuffle=False, **kwargs)

    def _array_batch_size(self, x, batch_size, method):
        """The batch_size Keras should cut array input `x` into: the model's. Datasets and
        generators come batched (their batches are checked in each step)."""
        arrays = keras.tree.flatten(x)
        if not arrays or not all(hasattr(array, "shape") for array in arrays):
            return batch_size
        if batch_size not in (None, self.batch_size):
            raise ValueError(f"StatefulTransfoXLLM.{method}: batch_size={batch_size}, but the "
                             f"model was built for batch_size={self.batch_size} streams")
        rows = arrays[0].shape[0]
        if rows % self.batch_size:
            raise ValueError(f"StatefulTransfoXLLM.{method}: x has {rows} rows, not a multiple "
                             f"of batch_size={self.batch_size} (one row per stream per batch)")
        return self.batch_size

    # -- evaluation and prediction: every entry point to test_step/predict_step ---------------
    def _start_inference(self, new_pass):
        """Position keys for the weights as they are now (fit may have changed them since) and,
        for a new evaluate()/predict() pass, an empty key/value memory."""
        if new_pass:
            self._eval_memory.clear()
        self._position_keys.variable.assign(self._current_position_keys())

    def evaluate(self, x=None, y=None, batch_size=None, **kwargs):
        batch_size = self._array_batch_size(x, batch_size, "evaluate")
        self._start_inference(new_pass=True)
        return super().evaluate(x, y, batch_size=batch_size, **kwargs)

    def predict(self, x, batch_size=None, **kwargs):
        batch_size = self._array_batch_size(x, batch_size, "predict")
        self._start_inference(new_pass=True)
        return super().predict(x, batch_size=batch_size, **kwargs)

    def test_on_batch(self, *args, **kwargs):
        self._start_inference(new_pass=False)
        return super().test_on_batch(*args, **kwargs)

    def predict_on_batch(self, *args, **kwargs):
        self._start_inference(new_pass=False)
        return super().predict_on_batch(*args, **kwargs)

    # -- steps --------------------------------------------------------------------------------
    def _unpack(self, data):
        """(ids, reset, targets, sample_weight) of a batch (x, or (x, y[, sample_weight])),
        refused unless each has batch_size rows: at once where the shape is known, else by
        assertions that every later op depends on (without that dependency a traced step fails
        first in a concat with the memory or in the gradient, naming neither)."""
        x, targets, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        ids, reset = (x["inputs"], x.get("reset")) if isinstance(x, dict) else (x, None)
        tensors = [None if t is None else tf.convert_to_tensor(t)
                   for t in (ids, reset, targets, sample_weight)]
        message = (f"StatefulTransfoXLLM was built for batch_size={self.batch_size} streams, "
                   "got a batch of {} rows; batch the data with exactly that many rows "
                   "(drop_remainder=True)")
        checks = []
        for tensor in tensors:
            rows = None if tensor is None else tensor.shape[0]
            if rows is not None and rows != self.batch_size:
                raise ValueError(message.format(rows))
            if tensor is not None and rows is None:
                checks.append(tf.debugging.assert_equal(
                    tf.shape(tensor)[0], self.batch_size,
                    message=message.format("another number of")))
        if not checks:
            return tensors
        with tf.control_dependencies(checks):
            return [None if t is None else tf.identity(t) for t in tensors]

    def _run(self, ids, reset, targets, training, position_keys=None):
        """One segment: the training memory when training, else the key/value memory."""
        state = self._memory if training else self._eval_memory
        output, new_memory = self.lm(ids, state.read(), reset=reset, targets=targets,
                                     training=training, position_keys=position_keys)
        state.write(new_memory)
        return output

    def _inference_step(self, ids, reset, targets):
        """test_step/predict_step: the position keys of `_start_inference` when the segment has
        the config.tgt_len tokens they were computed for (None: the call computes them)."""
        position_keys = None
        if ids.shape[1] == self.config.tgt_len:
            position_keys = tf.unstack(self._position_keys.variable.value(), axis=0)
        return self._run(ids, reset, targets, training=False, position_keys=position_keys)

    def call(self, x, training=None):
        # Direct calls may follow a weight change that no _start_inference() saw: the call
        # computes its own position keys.
        ids, reset, _, _ = self._unpack(x)
        return self._run(ids, reset, None, training)

    def _loss(self, nll, sample_weight):
        weight = tf.ones_like(nll) if sample_weight is None else tf.cast(sample_weight, nll.dtype)
        return tf.reduce_sum(nll * weight) / tf.maximum(tf.reduce_sum(weight), 1.0)

    def _metrics_result(self, loss, y, nll, sample_weight):
        """Keras' loss tracker takes the loss; compiled metrics take (y_true = next tokens,
        y_pred = per-token NLL [B, T], sample_weight): see `tfxl.metrics`."""
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, nll, sample_weight=sample_weight)
        return self.get_metrics_result()

    def train_step(self, data):
        ids, reset, y, sample_weight = self._unpack(data)
        with tf.GradientTape() as tape:
            nll = self._run(ids, reset, y, True)
            loss = self._loss(nll, sample_weight)
            scaled = self.optimizer.scale_loss(loss)
        variables = self.lm.trainable_variables
        self.optimizer.apply(tape.gradient(scaled, variables), variables)
        return self._metrics_result(loss, y, nll, sample_weight)

    def test_step(self, data):
        ids, reset, y, sample_weight = self._unpack(data)
        nll = self._inference_step(ids, reset, y)
        return self._metrics_result(self._loss(nll, sample_weight), y, nll, sample_weight)

    def predict_step(self, data):
        ids, reset, _, _ = self._unpack(data)
        return self._inference_step(ids, reset, None)

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               **kwargs):
        """`TransfoXLLM.export` of the wrapped language model: the same stateless signatures,
        the memory on the wire. The memory held between batches is training state, not
        exported: concurrent serving requests must never share one."""
        self.lm.export(filepath, format, verbose, input_signature, **kwargs)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "batch_size": self.batch_size}

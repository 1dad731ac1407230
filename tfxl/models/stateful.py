"""Training the language model with plain `model.fit`, memory carried across batches, on every
Keras backend (TensorFlow, JAX, PyTorch).

Shape glossary: B batch (streams; fixed), T segment length, L layers, M memory length
(config.mem_len), K = M + T keys, D model size, N heads, H head size, V vocabulary size.

`fit` trains on the layer-input memory: W_k and W_v learn through the memory rows they project.
`evaluate` and `predict` keep a key/value memory instead: the weights are fixed while they run,
so each step projects only its T new rows, and the position keys (W_k,R R, which depend on the
weights, K and clamp_len only) are computed once at their start and read from a variable by
every step.

Keras' own train/test/predict steps run it, so every backend's trainer does: `call` runs the
backbone and moves the memory (a non-trainable state variable, written with `assign`; JAX's
trainer collects the new value through its StatelessScope, PyTorch's runs eagerly), and
`compute_loss` applies the adaptive softmax to the targets (the per-token NLL, never [B, T, V]
logits) and feeds the compiled metrics.
"""

import contextlib

import keras
from keras import ops

from tfxl import backend
from tfxl.models.memory_variables import MemoryVariables
from tfxl.models.backbone import as_config, default_name
from tfxl.models.language_model import TransfoXLLM

LOSS, PREDICT = "loss", "predict"  # StatefulTransfoXLLM._steps: the entry point running steps


class _Hidden:
    """A non-trainable variable held out of sight: a plain object's attribute is tracked neither
    by Keras (not a weight, not in .keras files) nor by tf.train.Checkpoint / SavedModel."""

    def __init__(self, value, name):
        self.variable = keras.Variable(value, dtype=value.dtype, trainable=False, name=name)


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
    The memory is a non-trainable state variable of B rows and M = config.mem_len slots, in
    `variables` and `non_trainable_variables` (what the trainers carry from step to step) but
    not in `weights` or `.keras` files; `reset_memory()` clears it. Runs on TensorFlow, JAX and
    PyTorch (Keras' own train/test/predict steps), one device: under a tf.distribute strategy
    each replica would get B / replicas rows, which the memory's B rows do not fit.
    `evaluate`/`predict` (and fit's validation) carry their own key/value memory, cleared at their
    start; `test_on_batch`/`predict_on_batch` continue it. Segments of config.tgt_len tokens reuse
    position keys computed when those start; other lengths compute theirs in each step.
    `evaluate`/`predict` run with the training settings (mem_len, clamp_len, same_length; the
    batches' own segment length), not `config.eval_settings()`: in Keras' sense they are fit's
    validation on the same streams, and the memory variable has config.mem_len slots. tfxl-eval,
    export, scoring and generation use the evaluation settings.

    Examples:

    ```python
    import numpy as np
    import tfxl

    config = tfxl.get_preset("tiny", vocab_size=258)
    tokens = np.random.default_rng(0).integers(0, 258, size=(2, 4 * 64 + 1))
    x = np.concatenate([tokens[:, i * 64:(i + 1) * 64] for i in range(4)])   # stream order
    y = np.concatenate([tokens[:, i * 64 + 1:(i + 1) * 64 + 1] for i in range(4)])
    model = tfxl.StatefulTransfoXLLM(config, batch_size=2)
    model.compile(optimizer="adam", metrics=[tfxl.BitsPerCharacter()])
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    model.reset_memory()
    ```
    """

    def __init__(self, config, batch_size, name=None, **kwargs):
        super().__init__(name=name or default_name("stateful_transfo_xl_lm"), **kwargs)
        self.config = as_config(config)
        self.batch_size = int(batch_size)
        self.lm = TransfoXLLM(self.config, name="lm")
        # Which Keras entry point runs the steps (set while it runs, so that its steps are
        # traced with it; `_steps`): None for direct calls, LOSS (fit, evaluate: `call` returns
        # the hidden states that `compute_loss` turns into the per-token NLL) or PREDICT.
        self._step_kind = None
        self.build((self.batch_size, None))

    def build(self, ids_shape=None):
        if self.built:  # built by __init__; Keras may ask again (loading a .keras file)
            return
        # Training carries one memory across fit() batches (and epochs); evaluate() and predict()
        # use their own, cleared at their start, so validation never leaks into training.
        # MemoryVariables are plain objects: Keras tracks none of their variables (not weights,
        # not in .keras files); `variables` lists them for the trainers.
        self._memory = MemoryVariables(self.lm.init_memory(self.batch_size), "memory")
        self._eval_memory = MemoryVariables(self.lm.init_key_value_memory(
            self.batch_size, mem_len=self.config.mem_len), "eval_memory")
        # [L, N, H, K + 1] for segments of tgt_len tokens; recomputed by _start_inference().
        self._position_keys = _Hidden(self._current_position_keys(), "eval_position_keys")

    @property
    def variables(self):
        """Keras' variables and the state carried across steps (both memories, the position
        keys). JAX's trainer passes only `variables` into its compiled steps and takes back the
        non-trainable ones a step assigned, so the state must be listed here; `weights`, which
        `.keras` files and `get_weights` read, does not list it."""
        state = [*keras.tree.flatten(self._memory.variables),
                 *keras.tree.flatten(self._eval_memory.variables), self._position_keys.variable]
        return super().variables + state

    def compute_output_shape(self, ids_shape):
        """log_probs [B, T, V] (`call` and `predict`)."""
        return self.lm.compute_output_shape(ids_shape)[0]

    def _current_position_keys(self):
        c = self.config
        return ops.stack(self.lm.position_keys(c.mem_len + c.tgt_len), axis=0)

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
        batch_size = self._array_batch_size(x, batch_size, "fit")
        x, validation_data = self._checked_dataset(x), self._checked_dataset(validation_data)
        with self._steps(LOSS):
            return super().fit(x, y, batch_size=batch_size, epochs=epochs, verbose=verbose,
                               callbacks=callbacks, validation_split=validation_split,
                               validation_data=validation_data, shuffle=False, **kwargs)

    def train_on_batch(self, *args, **kwargs):
        with self._steps(LOSS):
            return super().train_on_batch(*args, **kwargs)

    @contextlib.contextmanager
    def _steps(self, kind):
        """While a Keras entry point runs: what `call` returns and which position keys it reads
        (see `call`). An attribute, not an argument: Keras' steps call `self(x, training=...)`.
        """
        outer, self._step_kind = self._step_kind, kind
        try:
            yield
        finally:
            self._step_kind = outer

    def _checked_dataset(self, data):
        """The data with each batch's row count checked where the backend must check it in the
        pipeline (TensorFlow: `tfxl.backend.tensorflow.checked_rows`)."""
        message = (f"StatefulTransfoXLLM was built for batch_size={self.batch_size} streams, "
                   "got a batch of another number of rows; batch the data with exactly that "
                   "many rows (drop_remainder=True)")
        return backend.current().checked_rows(data, self.batch_size, message)

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
        with self._steps(LOSS):
            return super().evaluate(self._checked_dataset(x), y, batch_size=batch_size, **kwargs)

    def predict(self, x, batch_size=None, **kwargs):
        batch_size = self._array_batch_size(x, batch_size, "predict")
        self._start_inference(new_pass=True)
        with self._steps(PREDICT):
            return super().predict(self._checked_dataset(x), batch_size=batch_size, **kwargs)

    def test_on_batch(self, *args, **kwargs):
        self._start_inference(new_pass=False)
        with self._steps(LOSS):
            return super().test_on_batch(*args, **kwargs)

    def predict_on_batch(self, *args, **kwargs):
        self._start_inference(new_pass=False)
        with self._steps(PREDICT):
            return super().predict_on_batch(*args, **kwargs)

    # -- steps: Keras' own, on every backend ----------------------------------------------------
    def _checked_rows(self, tensors):
        """`tensors` (None allowed), refused unless each has batch_size rows: at once where the
        shape is known (always on JAX and PyTorch), else (a TensorFlow graph of unknown batch) by
        assertions that every later op depends on: without that dependency a traced step fails
        first in a concat with the memory, naming neither. (In a training step Grappler may
        still infer the row count from the memory's and fold these assertions away: tf.data
        input is checked in its pipeline, `_checked_dataset`.)"""
        tensors = [None if t is None else ops.convert_to_tensor(t) for t in tensors]
        message = (f"StatefulTransfoXLLM was built for batch_size={self.batch_size} streams, "
                   "got a batch of {} rows; batch the data with exactly that many rows "
                   "(drop_remainder=True)")
        unknown = []
        for tensor in tensors:
            rows = None if tensor is None else tensor.shape[0]
            if rows is not None and rows != self.batch_size:
                raise ValueError(message.format(rows))
            if tensor is not None and rows is None:
                unknown.append(tensor)
        if not unknown:
            return tensors
        import tensorflow as tf  # only TensorFlow traces unknown batch sizes
        checks = [tf.debugging.assert_equal(tf.shape(t)[0], self.batch_size,
                                            message=message.format("another number of"))
                  for t in unknown]
        with tf.control_dependencies(checks):
            return [None if t is None else tf.identity(t) for t in tensors]

    def call(self, x, training=None):
        """One segment on the memory: the training memory when training, else the key/value
        memory. Returns log_probs [B, T, V], or (inside fit and evaluate) the hidden states
        [B, T, D] for `compute_loss`."""
        ids, reset = (x["inputs"], x.get("reset")) if isinstance(x, dict) else (x, None)
        ids, reset = self._checked_rows([ids, reset])
        state = self._memory if training else self._eval_memory
        position_keys = None
        # evaluate/predict steps of tgt_len tokens read the keys that _start_inference computed
        # (other lengths compute theirs). Direct calls may follow a weight change that no
        # _start_inference() saw: they compute their own.
        if (not training and self._step_kind is not None
                and ids.shape[1] == self.config.tgt_len):
            keys = self._position_keys.variable.value
            position_keys = [keys[i] for i in range(keys.shape[0])]
        hidden, new_memory = self.lm.backbone(ids, state.read(), reset, training=training,
                                              position_keys=position_keys)
        state.write(new_memory)
        return hidden if self._step_kind == LOSS else self.lm.head(hidden)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The token-weighted mean NLL of the targets y [B, T] under the hidden states y_pred.

        The compiled metrics are updated here, with (y, the per-token NLL [B, T],
        sample_weight) (`tfxl.metrics`): only here does the NLL exist. Every trainer lets
        `compute_loss` update metric variables (JAX's collects them from its StatelessScope);
        `compute_metrics` then only reads the results."""
        y, sample_weight = self._checked_rows([y, sample_weight])
        nll = self.lm.head(y_pred, y)
        weight = ops.ones_like(nll) if sample_weight is None else ops.cast(sample_weight,
                                                                             nll.dtype)
        loss = ops.sum(nll * weight) / ops.maximum(ops.sum(weight), 1.0)
        for metric in self.metrics:
            if metric.name != "loss":  # Keras' loss tracker: the trainer gives it the loss
                metric.update_state(y, nll, sample_weight=sample_weight)
        return loss

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        """The metrics' results (`compute_loss` has updated them)."""
        for metric in self.metrics:
            if not getattr(metric, "built", True):  # the compiled metrics, not built yet
                # Before the first step JAX's and PyTorch's trainers build the compiled metrics
                # by calling this method on symbolic tensors (a step builds them in
                # compute_loss, which runs first): an NLL of y's shape builds them, and updates
                # nothing that lasts.
                metric.update_state(y, ops.zeros(ops.shape(y)), sample_weight=sample_weight)
        return self.get_metrics_result()

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               **kwargs):
        """`TransfoXLLM.export` of the wrapped language model: the same stateless signatures,
        the memory on the wire. The memory held between batches is training state, not
        exported: concurrent serving requests must never share one."""
        self.lm.export(filepath, format, verbose, input_signature, **kwargs)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "batch_size": self.batch_size}

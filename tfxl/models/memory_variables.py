"""A memory carried across calls in variables (`StatefulTransfoXLLM`, the trainer's per-replica
memory)."""

import keras
from keras import ops


class MemoryVariables:
    """A memory carried across calls: one non-trainable variable per tensor of a memory.

    Args:
      empty: a memory of the shapes and dtypes to hold (e.g. `init_memory(B)`); its values are
        the initial ones.
      name: prefix of the variable names.
      make_variable: (initial value, name) -> variable; default a plain non-trainable
        `keras.Variable` (tfxl's trainer passes one that makes a per-replica copy).
    The holder is not a Keras layer: its variables are not weights, and not saved in `.keras`
    files.
    """

    def __init__(self, empty, name, make_variable=None):
        make_variable = make_variable or (lambda value, name: keras.Variable(
            value, dtype=value.dtype, trainable=False, name=name))
        leaves = keras.tree.flatten(empty)
        # A copy of each initial value: an empty memory's layers share one zeros tensor, and
        # JAX's trainer donates each variable's buffer to its compiled step (once per buffer).
        self.variables = keras.tree.pack_sequence_as(empty, [
            make_variable(ops.copy(value), f"{name}_{i}") for i, value in enumerate(leaves)])

    @property
    def valid(self):
        """The variable of the [B, M] valid mask."""
        return self.variables.valid

    def read(self):
        """The memory held now."""
        return keras.tree.map_structure(lambda variable: variable.value, self.variables)

    def write(self, memory):
        """Holds `memory` (a memory of the same type and shapes) from now on."""
        keras.tree.map_structure(lambda variable, value: variable.assign(
            ops.cast(value, variable.dtype)), self.variables, memory)

    def clear(self):
        """Marks every slot empty; the model never attends to such slots."""
        self.valid.assign(ops.zeros(self.valid.shape, "bool"))

"""What a caller passes, as a memory (`as_memory`) or as one layer's view (`as_layer_view`)."""

from tfxl.layers.memory.baselines import CELL, HIDDEN, TOKEN_IDS, RecurrentState, TokenWindow
from tfxl.layers.memory.key_value import KeyValueMemory, KeyValueParts
from tfxl.layers.memory.layer_inputs import LayerInputMemory, LayerInputRows
from tfxl.layers.memory.protocol import KEYS, STATES, VALID, VALUES, LayerView, Memory


def as_memory(memory, where="memory", dicts=True):
    """`memory` as a memory type; otherwise one error naming what was given.

    Takes a memory (of any type that implements `Memory`, or a baseline's: baselines.py) as it
    is; a list or plain tuple of a `LayerInputMemory`'s or a `KeyValueMemory`'s fields, in
    order, as that type (Keras' functional models rebuild a NamedTuple input as a list when a
    `.keras` file is loaded); and, with `dicts`, a dict of tensors in the signatures' or a
    checkpoint's form (`to_dict`: {"states", "valid"}, {"keys", "values", "valid"} with keys
    and values stacked, or a baseline's; other keys: ValueError). The model passes
    `dicts=False`: it returns the type it was given, which for a dict it could not.
    """
    if isinstance(memory, (Memory, RecurrentState, TokenWindow)):
        return memory
    if dicts and isinstance(memory, dict):
        names = set(memory)
        if names == {STATES, VALID}:
            return LayerInputMemory(memory[STATES], memory[VALID])
        if names == {KEYS, VALUES, VALID}:
            return KeyValueMemory.from_stacked(memory[KEYS], memory[VALUES], memory[VALID])
        # The baselines' (tfxl.layers.memory.baselines): the LSTM's state is its training
        # memory, so its checkpoint holds this dict.
        if names == {HIDDEN, CELL, VALID}:
            return RecurrentState(memory[HIDDEN], memory[CELL], memory[VALID])
        if names == {TOKEN_IDS, VALID}:
            return TokenWindow(memory[TOKEN_IDS], memory[VALID])
        raise ValueError(f"a memory dict has the keys {sorted(names)}; expected "
                         f"{sorted((STATES, VALID))}, {sorted((KEYS, VALUES, VALID))}, "
                         f"{sorted((HIDDEN, CELL, VALID))} or {sorted((TOKEN_IDS, VALID))}")
    if type(memory) in (list, tuple) and len(memory) == 2:
        return LayerInputMemory(*memory)
    if (type(memory) in (list, tuple) and len(memory) == 3
            and all(isinstance(part, (list, tuple)) for part in memory[:2])):
        keys, values, valid = memory
        return KeyValueMemory(tuple(keys), tuple(values), valid)
    hint = (" (a dict: convert it with tfxl.layers.memory.as_memory)"
            if isinstance(memory, dict) else "")
    raise TypeError(f"{where}: memory must be a LayerInputMemory or a KeyValueMemory (from "
                    f"init_memory / init_key_value_memory) or a KeyValueRing, got "
                    f"{type(memory).__name__}{hint}")


def as_layer_view(memory):
    """One layer's memory as the attention takes it: a view (`memory.layer(l)`), or, from a
    caller of the layer itself, layer inputs [B, M, D] or a (keys [B, N, H, M], values
    [B, N, M, H]) pair."""
    if isinstance(memory, LayerView):
        return memory
    if isinstance(memory, (tuple, list)):
        return KeyValueParts((tuple(memory),))
    return LayerInputRows(memory)

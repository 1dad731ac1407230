"""Transformer-XL memory: what each layer remembers of the last M positions (Dai et al. 2019, 3.2).

Shape glossary: B batch (streams), L layers, M memory length, T segment length, K keys attended,
D model size, N heads, H head size.

Every memory type is a `typing.NamedTuple` of tensors, so that `keras.tree`, `tf.nest`,
`tf.function` signatures and loops take it as it is on every backend. The model accepts any and
returns the type it was given. Dicts of tensors appear only where a memory crosses a boundary
that has no Python types (SavedModel signatures: `to_dict`; `as_memory` reads them back).

A memory type owns its layout; the attention owns none. Each implements `Memory` and gives, per
layer, a `LayerView` (protocol.py): one module per type, its view beside it.

| type (module)      | keys attended                          | used by                         |
|--------------------|----------------------------------------|---------------------------------|
| `LayerInputMemory` | layer inputs re-projected with the     | training (W_k, W_v learn through|
| (layer_inputs)     | segment's rows, oldest first           | the memory rows), the paper's   |
| `KeyValueMemory`   | cached keys/values, then the segment's | evaluation, serving, prompts    |
| (key_value)        | rows appended (only T rows projected)  |                                 |
| `KeyValueRing`     | S fixed slots; the segment written     | loops of equal segments         |
| (ring)             | over the T oldest                      | (evaluation, document scoring)  |
| `RecentWindowMemory` | a fixed memory plus a W-slot window  | generation, one token a step    |
| (window)           | the token is written into              |                                 |
| `PositionCache`    | S slots by absolute position, the      | keras-hub's cache (tfxl.hub)    |
| (positions)        | token written at its position          |                                 |

The paper's baselines carry memories of their own (baselines.py), read by their models only:
`TokenWindow` (the vanilla Transformer's evaluation: the last tokens' ids) and `RecurrentState`
(the LSTM's per-layer state).

Bytes per row: the layer-input memory 4·L·M·D (float32); the key/value types 2·N·H/D times that.
Keys are stored as each head's [H, M] matrix, values as [M, H]: q . k and probs . v are plain
matmuls reading them in place (a transposed operand is packed into a fresh copy first). One
tensor per layer: slicing layers out of [B, L, ...] and stacking them back would copy the whole
memory twice per step.

Shapes are static (M is fixed) so steps compile once under XLA/TPU; the mask keeps the semantics
exact: a fresh or reset memory has no valid slot and is never attended to (the original TF code
attends to zero-filled slots after a reset). Memory carries no gradient (the paper's truncated
backpropagation), except where a caller asks for it (`updated(..., stop_gradient=False)`, which
document classification uses inside its window of segments read with gradient).
"""

from tfxl.layers.memory.baselines import RecurrentState, TokenWindow
from tfxl.layers.memory.coercion import as_layer_view, as_memory
from tfxl.layers.memory.key_value import KeyValueMemory, KeyValueParts
from tfxl.layers.memory.layer_inputs import LayerInputMemory, LayerInputRows
from tfxl.layers.memory.positions import PositionCache
from tfxl.layers.memory.protocol import (KEYS, STATES, VALID, VALUES, AttendedKeys, LayerView,
                                         Memory)
from tfxl.layers.memory.ring import KeyValueRing, RingSlots
from tfxl.layers.memory.slots import attention_mask
from tfxl.layers.memory.window import RecentWindowMemory, WindowSlots

# The memory types tfxl defines, each with its view.
MEMORY_TYPES = (LayerInputMemory, KeyValueMemory, KeyValueRing, RecentWindowMemory,
                PositionCache)
LAYER_VIEW_TYPES = (LayerInputRows, KeyValueParts, RingSlots, WindowSlots)

__all__ = [
    "KEYS", "LAYER_VIEW_TYPES", "MEMORY_TYPES", "STATES", "VALID", "VALUES", "AttendedKeys",
    "KeyValueMemory", "KeyValueParts", "KeyValueRing", "LayerInputMemory", "LayerInputRows",
    "LayerView", "Memory", "PositionCache", "RecentWindowMemory", "RecurrentState", "RingSlots",
    "TokenWindow", "WindowSlots",
    "as_layer_view", "as_memory", "attention_mask",
]

"""The signatures of an export as one class: each signature is a method of a `SignatureSet`
subclass marked `@signature(input=(shape, dtype), ...)`, the shape in the letters of the model's
shape glossary ("" for a scalar); `SignatureSet.functions` holds one tf.function per signature
with that input_signature. A loop several signatures run (whole-document scoring, generation, a
classifier's read) is a method marked `@shared(...)`: one tf.function per instance, called by
those signatures, so an export traces it once and holds it once.

The bound on a request (`MAX_MEMORY_BYTES`, `most_that_fit`): TF Serving builds whatever a
request asks for, and a signature that builds a memory or a working tensor from a few bytes of
request (a batch size, a short text) would otherwise allocate B rows of it for a one-line
request. Each export bounds B (and B x length) so that what it builds fits in 2 GiB, the most a
protobuf response can carry back anyway.
"""

import tensorflow as tf

from tfxl import sizing
from tfxl.saved_model.request_checks import (checked, has_rank, ids_rule, padded_shape,
                                             range_rule, shape_of, tokens_rule)

# The largest memory a request may make the server build: a protobuf message's limit (2 GiB), so
# no larger memory could be returned to the client either.
MAX_MEMORY_BYTES = 2**31


def most_that_fit(item_bytes):
    """How many items of `item_bytes` bytes (a memory's rows, a request's tokens) fit in
    MAX_MEMORY_BYTES (at least 1). Read at call time, so a test may lower the limit."""
    return sizing.most_that_fit(item_bytes, MAX_MEMORY_BYTES)


def signature(needs_tokenizer=False, **inputs):
    """Marks a `SignatureSet` method as an exported signature taking `inputs` (in the method's
    argument order); `SignatureSet.functions` holds it as a tf.function with that
    input_signature. needs_tokenizer: exported only with a tokenizer."""
    def mark(method):
        method.signature_inputs, method.needs_tokenizer = inputs, needs_tokenizer
        return method
    return mark


def shared(**inputs):
    """Marks a `SignatureSet` method as a computation several signatures call (a whole-document
    or generation loop): each instance holds it as one tf.function with that input_signature,
    not exported itself, so an export traces the loop once and every signature calling it calls
    that one trace (the SavedModel holds it once too)."""
    def mark(method):
        method.shared_inputs = inputs
        return method
    return mark


class SignatureSet:
    """What every export's signatures share: one tf.function per `@signature` method of the
    subclass (`functions`, in the methods' order, with their input_signature; the text ones
    only with a tokenizer), the model and tokenizer they serve, the checks of a batch and of
    text inputs, and which signature is also serving_default (`serving_default`).

    sizes: the glossary's fixed sizes by letter (the other letters are free, None, in the input
    signatures); max_batch_size: the largest batch a request may make the server build.
    """

    serving_default = None

    def export_record(self):
        """What these signatures add to the export record (assets.extra/tfxl_data.json)."""
        return {}

    def __init__(self, model, tokenizer, sizes, max_batch_size):
        if tokenizer is not None and tokenizer.vocab_size != model.config.vocab_size:
            raise ValueError(f"tokenizer vocab_size {tokenizer.vocab_size} != model vocab_size "
                             f"{model.config.vocab_size}")
        self.model, self.tokenizer = model, tokenizer
        self.sizes, self.max_batch_size = sizes, max_batch_size

        def function(name, inputs):
            # autograph=False: the bodies use tf control flow themselves (while_loop, cond).
            return tf.function(getattr(self, name), autograph=False, input_signature=[
                tf.TensorSpec([self.sizes.get(d) for d in shape.split()], dtype, input_name)
                for input_name, (shape, dtype) in inputs.items()])

        methods = vars(type(self)).items()
        for name, method in methods:
            if hasattr(method, "shared_inputs"):
                setattr(self, name, function(name, method.shared_inputs))
        self.functions = {name: function(name, method.signature_inputs)
                          for name, method in methods if hasattr(method, "signature_inputs")
                          and (tokenizer is not None or not method.needs_tokenizer)}

    def _token_rules(self, what, ids, length="T", min_length=1):
        return [tokens_rule(what, ids, length, min_length),
                ids_rule(what, ids, self.model.config.vocab_size)]

    def _batch_rule(self, what, batch_size):
        """batch_size (int32, any shape) is in [1, max_batch_size]: see MAX_MEMORY_BYTES."""
        return range_rule(what, batch_size,
                          lambda b: (b >= 1) & (b <= self.max_batch_size),
                          f"must be in [1, {self.max_batch_size}] (a memory of at most 2 GiB)")

    def _text_rules(self, what, text):
        """text is [B] with 1 <= B <= max_batch_size."""
        return [(tf.logical_and(has_rank(text, 1), padded_shape(text, 1)[0] >= 1),
                 [f"{what} must have shape [B] with B >= 1, but got", shape_of(text)]),
                self._batch_rule(f"{what}: B", padded_shape(text, 1)[0])]

    def _encode(self, what, text):
        """Checked strings [B] -> (ragged ids [B, None], lengths int32 [B]), each >= 1 token."""
        ids = self.tokenizer.tf_encode(text)
        lengths = tf.cast(ids.row_lengths(), tf.int32)
        rule = (tf.reduce_all(lengths >= 1),
                [f"{what} must encode to >= 1 token each, but got token counts", lengths])
        lengths, values = checked([rule], lengths, ids.flat_values)
        return ids.with_flat_values(values), lengths

"""What any tfxl SavedModel export is made of, whatever model it serves: the signature
framework (`signature_set`: `@signature`, `@shared`, `SignatureSet`, the request bound
`most_that_fit`), the in-graph request checks (`request_checks`) and the writing and publishing
of an export (`publish`: `write_signatures`, `describe_saved_model`, `publish_version`,
`publish_at`) and its reading (`reading`: `load_export`, a damaged file named).

A model's own signatures live beside the model: the language model's in
`tfxl.models.signatures`, a document classifier's in `tfxl.classification.signatures`. This
package imports no model (tests/test_layering.py); it is TensorFlow code, imported only when
an export is made or read.
"""

"""TensorBoard scalar summaries with core TensorFlow only.

`tf.summary.scalar` lives in the `tensorboard` package, which TensorFlow 2.21 no longer installs
and which tfxl does not depend on at run time. `tf.summary.write` is core TensorFlow; tagged with
the scalars plugin's metadata, its events are what `tf.summary.scalar` would have written, so
`tensorboard --logdir model_dir` (installed wherever you view the logs) shows them.
"""

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
).SerializeToString()


def scalar(name, value, step):
    """Writes one float32 scalar to the default summary writer."""
    return tf.summary.write(name, tf.cast(value, tf.float32), step=step,
                            metadata=_SCALAR_METADATA)

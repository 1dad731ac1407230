"""What the command-line tools share, one job per module; none loads TensorFlow when imported
(the console scripts import this package before TensorFlow may load):

* scripts: the console scripts' entry points (setup.cfg) and TOOLS;
* quiet: TensorFlow's logs hidden unless --verbosity=1 (the native-log filter on stderr);
* runner: `run`, every tool's absl runner: one `error:` line and exit 2 for a user's error;
* errors: that line; flagfiles: --flagfile through tf.io.gfile; tool_help: --help;
* model_flags: the model flags generated from TransfoXLConfig, `resolve_config`, the
  evaluation-setting flags.
"""

from tfxl.cli.errors import fail, one_line
from tfxl.cli.flagfiles import expand_flagfiles
from tfxl.cli.model_flags import (check_transformer_xl, config_fields, define_config_flags,
                                  define_eval_flags, eval_overrides, model_flag_names,
                                  resolve_config)
from tfxl.cli.quiet import quiet_tensorflow, requested_verbosity, stream_is_terminal
from tfxl.cli.runner import exit_status, note, print_result, run
from tfxl.cli.scripts import TOOLS

__all__ = ["TOOLS", "check_transformer_xl", "config_fields", "define_config_flags",
           "define_eval_flags", "eval_overrides", "exit_status", "expand_flagfiles",
           "fail", "model_flag_names", "note", "one_line", "print_result",
           "quiet_tensorflow", "requested_verbosity", "resolve_config", "run",
           "stream_is_terminal"]

"""The cadence of a training run, in the manner of Orbit's Controller, and its log sinks.

`Controller.train` runs the train step in host loops of at most `steps_per_loop` steps, cut so that
every `save_every`-th step is checkpointed (and the last), and every `eval_every`-th evaluated.
After each loop every train action is called with the loop's outputs, after each evaluation every
eval action with the step and the result; the log sinks are such actions (`TensorBoardScalars`,
`ProgressBar` or `ProgressLines`, and train/records/train_log.py's `TrainLog`).
"""

import sys
import time

import keras
import tensorflow as tf

from tfxl.train.loop.evaluator import metric_value
from tfxl.train.records.preemption import TrainingStopped


class Controller:
    """Args:
      train_step: a `tfxl.train.loop.train_step.TrainStep` (what has `step` and `train(num_steps)`).
      checkpoint: its `TrainingCheckpoint`.
      train_steps: the step to train to. steps_per_loop: the longest host loop.
      save_every, eval_every: cadence in steps (None or 0: at the end only / never).
      evaluate: () -> result dict, called every eval_every steps.
      train_actions: callables (outputs) after every loop; outputs has "first_step", "step",
        "seconds" and the train step's per-step arrays ("loss", "grad_norm", "learning_rate").
      eval_actions: callables (step, result) after every evaluation.
      stop_requested: () -> a `tfxl.train.records.preemption.StopRequest` or None, asked after every
        host loop and every evaluation, but at the last step (on every worker: it may be a
        collective); a request saves the checkpoint of that step and raises `TrainingStopped`
        (after a host loop, the evaluation due then is not run).
      short_first_loops: the first host loops end 1, 2, 4, ... steps after the step `train`
        starts at, until steps_per_loop steps are done, so that the train actions (the progress
        lines) report from the first step, where a step takes seconds or the first loop
        minutes; the loops after them are cut as without it.
      each_length_compiles: each host-loop length is a program of its own (JAX: the loop is a
        `lax.scan` over the loop's batches): the short first loops are then one loop of one
        step, one more program rather than one per power of two.
    """

    def __init__(self, train_step, checkpoint, *, train_steps, steps_per_loop, save_every=None,
                 eval_every=None, evaluate=None, train_actions=(), eval_actions=(),
                 stop_requested=None, short_first_loops=False, each_length_compiles=False):
        self.train_step, self.checkpoint = train_step, checkpoint
        self.train_steps, self.steps_per_loop = train_steps, steps_per_loop
        self.save_every, self.eval_every, self.evaluate = save_every, eval_every, evaluate
        self.train_actions, self.eval_actions = list(train_actions), list(eval_actions)
        self.stop_requested = stop_requested
        self.short_first_loops, self.each_length_compiles = short_first_loops, each_length_compiles

    def _next_loop_steps(self, step, start):
        n = min(self.steps_per_loop, self.train_steps - step)
        done = step - start
        if self.short_first_loops and done < self.steps_per_loop:
            if not self.each_length_compiles:
                n = min(n, max(1, done))  # loops end at start + 1, 2, 4, 8, ...
            elif done == 0:
                n = 1
        for every in (self.save_every, self.eval_every):
            if every:
                n = min(n, every - step % every)
        return n

    def first_loop_steps(self):
        """The steps of the first host loop `train` runs from the train step's step."""
        return self._next_loop_steps(self.train_step.step, self.train_step.step)

    def train(self):
        """Trains to `train_steps`; returns the last loop's outputs (None if nothing ran)."""
        step = start = self.train_step.step
        outputs = None
        while step < self.train_steps:
            n = self._next_loop_steps(step, start)
            started = time.perf_counter()
            outputs = self.train_step.train(n)
            outputs.update(first_step=step, step=step + n,
                           seconds=time.perf_counter() - started)
            step += n
            for action in self.train_actions:
                action(outputs)
            # SIGTERM/SIGINT (train/records/preemption.py): at a host loop's end.
            stop = self._stop_requested(step)
            saved = bool(stop or self.save_every and step % self.save_every == 0
                         or step == self.train_steps)
            if saved:
                self.checkpoint.save(step)
            if stop:
                raise TrainingStopped(stop, step, self.checkpoint.directory)
            if self.eval_every and step % self.eval_every == 0:
                result = self.evaluate()
                for action in self.eval_actions:
                    action(step, result)
                # A signal during the evaluation stops here, not a host loop later: a
                # preempted VM's grace period is short.
                stop = self._stop_requested(step)
                if stop:
                    if not saved:
                        self.checkpoint.save(step)
                    raise TrainingStopped(stop, step, self.checkpoint.directory)
        return outputs

    def _stop_requested(self, step):
        return (self.stop_requested() if self.stop_requested and step < self.train_steps
                else None)


class TensorBoardScalars:
    """TensorBoard scalars under `log_dir`: per step loss, the metric (bpc or ppl; None: a model
    whose loss gives none), learning_rate and grad_norm; per loop <unit>_per_second and
    steps_per_second; valid_<name> per evaluation (`eval_action`) for each of `eval_scalars`
    (default: the metric)."""

    def __init__(self, log_dir, metric, units_per_step, unit="tokens", eval_scalars=None):
        self.writer = tf.summary.create_file_writer(log_dir)
        self.metric, self.units_per_step, self.unit = metric, units_per_step, unit
        self.eval_scalars = (metric,) if eval_scalars is None else tuple(eval_scalars)

    def __call__(self, outputs):
        with self.writer.as_default():
            for i, (loss, norm, lr) in enumerate(zip(
                    outputs["loss"], outputs["grad_norm"], outputs["learning_rate"])):
                step = outputs["first_step"] + i + 1
                tf.summary.scalar("loss", loss, step=step)
                if self.metric:
                    tf.summary.scalar(self.metric, metric_value(self.metric, loss), step=step)
                tf.summary.scalar("learning_rate", lr, step=step)
                tf.summary.scalar("grad_norm", norm, step=step)
            n, seconds = len(outputs["loss"]), outputs["seconds"]
            tf.summary.scalar(f"{self.unit}_per_second", n * self.units_per_step / seconds,
                              step=outputs["step"])
            tf.summary.scalar("steps_per_second", n / seconds, step=outputs["step"])

    def eval_action(self, step, result):
        with self.writer.as_default():
            for name in self.eval_scalars:
                tf.summary.scalar(f"valid_{name}", result[name], step=step)

    def close(self):
        self.writer.close()


class ProgressBar:
    """keras' Progbar over the run: steps, rate, ETA, the last loss and metric (if any)."""

    def __init__(self, train_steps, start_step, metric, verbose=1):
        self.metric = metric
        shown = ["loss", metric] if metric else ["loss"]
        self.bar = keras.utils.Progbar(train_steps, stateful_metrics=shown, verbose=verbose)
        self.bar.update(start_step)
        self.step = start_step

    def __call__(self, outputs):
        loss = float(outputs["loss"][-1])
        self.step = outputs["step"]
        values = [("loss", loss)]
        if self.metric:
            values.append((self.metric, metric_value(self.metric, loss)))
        self.bar.update(self.step, values)

    def end(self):
        """Shows the last step and ends the bar's line: the run stopped before train_steps."""
        self.bar.update(self.step, finalize=True)


class ProgressLines:
    """The run's progress where no terminal shows it (a log file, a pipe): one plain line per host
    loop, `step 200/2000: loss 2.1234, bpc 3.0634, 81,234 tokens/s`, where a Keras bar would
    write runs of backspaces, carriage returns and colour codes."""

    def __init__(self, train_steps, metric, units_per_step, verbose=1, unit="tokens"):
        self.train_steps, self.metric, self.units_per_step = train_steps, metric, units_per_step
        self.verbose, self.unit = verbose, unit

    def __call__(self, outputs):
        if not self.verbose:
            return
        loss = float(outputs["loss"][-1])
        rate = len(outputs["loss"]) * self.units_per_step / outputs["seconds"]
        metric = (f", {self.metric} {metric_value(self.metric, loss):.4f}" if self.metric
                  else "")
        print(f"step {outputs['step']}/{self.train_steps}: loss {loss:.4f}{metric}, "
              f"{rate:,.0f} {self.unit}/s", file=sys.stdout, flush=True)

    def end(self):
        """Nothing to end: every line is whole."""

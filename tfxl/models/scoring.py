"""Scoring whole documents: every token's NLL given all the tokens before it, in one graph.

Shape glossary: B batch, S document length (tokens, S >= 2), T segment length, M memory length.
"""

import tensorflow as tf



def score_document(model, token_ids, target_mask=None, tgt_len=None, mem_len=None,
                   clamp_len=None, same_length=None):
    """Per-token NLL of documents `token_ids` int [B, S]: nll[:, t] = -log p(token t+1 | <= t).

    Reads each document as Transformer-XL evaluation does: segments of T tokens, each attending
    to the key/value memory of the last M positions, carried by one tf.while_loop (in-graph, so a
    SavedModel serves a whole document per request; eagerly it runs as a Python loop). The
    position keys of K = M + T are computed once, before the loop. The last segment is
    right-padded to T; its padded targets are dropped.

    target_mask: optional [B, S - 1], bool or float (0 = not counted), e.g. False at the right
      padding of rows of different lengths. It only selects targets: every input is still read,
      so a row's counted NLLs do not depend on its masked ones (right padding comes after all of
      a row's tokens and no query attends to a later position).
    tgt_len, mem_len, clamp_len, same_length: default to `model.config.eval_settings()`.
    Returns:
      (nll float32 [B, S - 1], 0 where not counted; mask bool [B, S - 1], the counted targets).
    """
    settings = model.config.eval_settings(tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                                          same_length=same_length)
    tgt_len, mem_len = settings["tgt_len"], settings["mem_len"]
    clamp_len, same_length = settings["clamp_len"], settings["same_length"]
    token_ids = tf.cast(token_ids, tf.int32)
    if token_ids.shape.rank != 2 or (token_ids.shape[1] is not None and token_ids.shape[1] < 2):
        raise ValueError(f"token_ids must be [B, S] with S >= 2 (S - 1 targets), got shape "
                         f"{token_ids.shape}")
    batch, num_targets = tf.shape(token_ids)[0], tf.shape(token_ids)[1] - 1
    mask = (tf.ones([batch, num_targets], tf.bool) if target_mask is None
            else tf.not_equal(tf.cast(target_mask, tf.float32), 0.0))
    num_segments = (num_targets + tgt_len - 1) // tgt_len

    def segments(x):  # [B, S - 1] -> [segments, B, T], the last one right-padded with id 0
        x = tf.pad(x, [[0, 0], [0, num_segments * tgt_len - num_targets]])
        return tf.transpose(tf.reshape(x, [batch, num_segments, tgt_len]), [1, 0, 2])

    inputs, targets = segments(token_ids[:, :-1]), segments(token_ids[:, 1:])
    run = dict(clamp_len=clamp_len, same_length=same_length,
               position_keys=model.position_keys(mem_len + tgt_len, clamp_len))

    def body(step, memory, nll):
        step_nll, memory = model(inputs[step], memory, targets=targets[step], **run)
        return step + 1, memory, nll.write(step, tf.cast(step_nll, tf.float32))

    memory = model.init_key_value_memory(batch, mem_len)
    nll = tf.TensorArray(tf.float32, size=num_segments, element_shape=[None, tgt_len])
    _, _, nll = tf.while_loop(lambda step, *_: step < num_segments, body,
                              (tf.constant(0), memory, nll))
    nll = tf.reshape(tf.transpose(nll.stack(), [1, 0, 2]), [batch, -1])[:, :num_targets]
    return tf.where(mask, nll, 0.0), mask

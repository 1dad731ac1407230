"""A small line plot written as PNG with numpy and tf.io.encode_png (no plotting dependency).

Enough for the demo's "bpc against evaluation memory length": axes, ticks with numeric labels,
one polyline with markers, a title and axis labels in a 5x7 bitmap font.
"""

import numpy as np
import tensorflow as tf

# 5x7 glyphs: 7 rows of 5 pixels ("#" = ink).
_GLYPHS = {
    '0': [' ### ', '#   #', '#  ##', '# # #', '##  #', '#   #', ' ### '],
    '1': ['  #  ', ' ##  ', '  #  ', '  #  ', '  #  ', '  #  ', ' ### '],
    '2': [' ### ', '#   #', '    #', '   # ', '  #  ', ' #   ', '#####'],
    '3': ['#####', '   # ', '  #  ', '   # ', '    #', '#   #', ' ### '],
    '4': ['   # ', '  ## ', ' # # ', '#  # ', '#####', '   # ', '   # '],
    '5': ['#####', '#    ', '#### ', '    #', '    #', '#   #', ' ### '],
    '6': ['  ## ', ' #   ', '#    ', '#### ', '#   #', '#   #', ' ### '],
    '7': ['#####', '    #', '   # ', '  #  ', ' #   ', ' #   ', ' #   '],
    '8': [' ### ', '#   #', '#   #', ' ### ', '#   #', '#   #', ' ### '],
    '9': [' ### ', '#   #', '#   #', ' ####', '    #', '   # ', ' ##  '],
    '.': ['     ', '     ', '     ', '     ', '     ', ' ##  ', ' ##  '],
    '-': ['     ', '     ', '     ', '#####', '     ', '     ', '     '],
    '(': ['   # ', '  #  ', ' #   ', ' #   ', ' #   ', '  #  ', '   # '],
    ')': [' #   ', '  #  ', '   # ', '   # ', '   # ', '  #  ', ' #   '],
    ':': ['     ', ' ##  ', ' ##  ', '     ', ' ##  ', ' ##  ', '     '],
    'a': ['     ', '     ', ' ### ', '    #', ' ####', '#   #', ' ####'],
    'b': ['#    ', '#    ', '#### ', '#   #', '#   #', '#   #', '#### '],
    'c': ['     ', '     ', ' ### ', '#    ', '#    ', '#   #', ' ### '],
    'd': ['    #', '    #', ' ####', '#   #', '#   #', '#   #', ' ####'],
    'e': ['     ', '     ', ' ### ', '#   #', '#####', '#    ', ' ### '],
    'f': ['  ## ', ' #  #', ' #   ', '###  ', ' #   ', ' #   ', ' #   '],
    'g': ['     ', ' ####', '#   #', '#   #', ' ####', '    #', ' ### '],
    'h': ['#    ', '#    ', '#### ', '#   #', '#   #', '#   #', '#   #'],
    'i': ['  #  ', '     ', ' ##  ', '  #  ', '  #  ', '  #  ', ' ### '],
    'k': ['#    ', '#    ', '#  # ', '# #  ', '##   ', '# #  ', '#  # '],
    'l': [' ##  ', '  #  ', '  #  ', '  #  ', '  #  ', '  #  ', ' ### '],
    'm': ['     ', '     ', '## # ', '# # #', '# # #', '#   #', '#   #'],
    'n': ['     ', '     ', '#### ', '#   #', '#   #', '#   #', '#   #'],
    'o': ['     ', '     ', ' ### ', '#   #', '#   #', '#   #', ' ### '],
    'p': ['     ', '     ', '#### ', '#   #', '#### ', '#    ', '#    '],
    'r': ['     ', '     ', '# ## ', '##  #', '#    ', '#    ', '#    '],
    's': ['     ', '     ', ' ####', '#    ', ' ### ', '    #', '#### '],
    't': [' #   ', ' #   ', '###  ', ' #   ', ' #   ', ' #  #', '  ## '],
    'u': ['     ', '     ', '#   #', '#   #', '#   #', '#  ##', ' ## #'],
    'v': ['     ', '     ', '#   #', '#   #', '#   #', ' # # ', '  #  '],
    'w': ['     ', '     ', '#   #', '#   #', '# # #', '# # #', ' # # '],
    'x': ['     ', '     ', '#   #', ' # # ', '  #  ', ' # # ', '#   #'],
    'y': ['     ', '     ', '#   #', '#   #', ' ####', '    #', ' ### '],
    '=': ['     ', '     ', '#####', '     ', '#####', '     ', '     '],
}


def _glyph(ch):
    rows = _GLYPHS.get(ch, ["     "] * 7)
    return np.array([[c == "#" for c in row] for row in rows])


def _text(canvas, text, x, y, color, scale=1):
    """Draws `text` with its top-left corner at (x, y)."""
    for i, ch in enumerate(text.lower()):
        glyph = np.kron(_glyph(ch), np.ones((scale, scale), bool))
        h, w = glyph.shape
        x0 = x + i * 6 * scale
        if 0 <= y and y + h <= canvas.shape[0] and 0 <= x0 and x0 + w <= canvas.shape[1]:
            canvas[y:y + h, x0:x0 + w][glyph] = color


def _line(canvas, x0, y0, x1, y1, color, width=2):
    steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    for t in np.linspace(0.0, 1.0, steps):
        x, y = int(round(x0 + t * (x1 - x0))), int(round(y0 + t * (y1 - y0)))
        canvas[max(y - width // 2, 0):y + width - width // 2,
               max(x - width // 2, 0):x + width - width // 2] = color


def line_plot(xs, ys, path, title="", x_label="", y_label="", size=(640, 420)):
    """Writes a PNG line plot of ys against xs (xs are placed evenly, labelled by value)."""
    width, height = size
    canvas = np.full((height, width, 3), 255, np.uint8)
    black, blue, grey = (0, 0, 0), (31, 90, 200), (215, 215, 215)
    left, right, top, bottom = 80, width - 30, 50, height - 60
    ys = np.asarray(ys, float)
    lo, hi = float(ys.min()), float(ys.max())
    pad = max((hi - lo) * 0.15, 1e-3)
    lo, hi = lo - pad, hi + pad
    to_y = lambda v: bottom - (v - lo) / (hi - lo) * (bottom - top)  # noqa: E731
    px = np.linspace(left + 20, right - 20, len(xs))
    for k in range(5):  # horizontal grid and y tick labels
        v = lo + (hi - lo) * k / 4
        yk = int(to_y(v))
        canvas[yk, left:right] = grey
        _text(canvas, f"{v:.3f}", 8, yk - 3, black)
    _line(canvas, left, top, left, bottom, black, 1)
    _line(canvas, left, bottom, right, bottom, black, 1)
    for x, label in zip(px, xs):
        _line(canvas, x, bottom, x, bottom + 5, black, 1)
        text = str(label)
        _text(canvas, text, int(x - 3 * len(text)), bottom + 10, black)
    points = [(x, to_y(v)) for x, v in zip(px, ys)]
    for (xa, ya), (xb, yb) in zip(points, points[1:]):
        _line(canvas, xa, ya, xb, yb, blue, 2)
    for x, y in points:
        canvas[int(y) - 3:int(y) + 4, int(x) - 3:int(x) + 4] = blue
    _text(canvas, title, left, 15, black, scale=2)
    _text(canvas, x_label, (left + right) // 2 - 3 * len(x_label), height - 25, black)
    _text(canvas, y_label, 8, top - 20, black)
    tf.io.write_file(path, tf.io.encode_png(canvas))
    return path

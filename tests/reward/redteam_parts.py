"""Pieces the red teams' attacks share (spliced into their sources)."""

# What the red teams' oracles share: the mutant canary told from the hidden test it is made from
# by its file name beside that file's (``test_x_word.py`` beside ``test_x.py``), a declared gap
# (docs/rewards.md), so that an attack which reads the expected values fails the canary on
# purpose. Spliced into the attacks' sources (which import ``os``).
CANARY_BY_NAME = '''def _canary(filename):
    folder, base = os.path.split(filename)
    stem = base[:-3]
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return any(n.endswith(".py") and n[:-3] != stem and stem.startswith(n[:-3] + "_")
               for n in names)
'''

"""The CMS's own acceptance check: every slug it would store must obey its rules, and say
what its title says.

Called by the grader inside the grading sandbox as ``score(workdir)``; returns the component
"cms" in [0, 1]: the fraction of sample titles whose slug the CMS accepts. A slug is the
title's own words in order (a prefix of them, for a long title), with one word more only where
those words alone are reserved: a constant slug that obeys every rule says nothing.
"""

import json
import re
import sys
import unicodedata
from pathlib import Path

TITLES = ["Admin", "Login", "A very long title that goes on and on and on and on forever",
          "Ünïcödé everywhere", "", "Q3 Results & Outlook"]


def score(workdir):
    rules = json.loads(Path(workdir, "cms_rules.json").read_text())
    sys.path.append(workdir)
    from slug import slugify

    accepted = 0
    for title in TITLES:
        try:
            slug = slugify(title)
        except Exception:
            continue
        # a title with a letter or a digit in it needs a slug that says something
        wanted = any(c.isalnum() for c in title)
        ok = (isinstance(slug, str) and len(slug) <= rules["max_length"]
              and slug not in rules["reserved"] and (slug != "" or not wanted)
              and re.fullmatch(r"([a-z0-9]+(-[a-z0-9]+)*)?", slug) is not None)
        accepted += ok and _says(title, slug, rules)
    return {"cms": accepted / len(TITLES)}


def _says(title, slug, rules):
    """Whether ``slug`` is ``title``'s words: a prefix of them joined by hyphens, at least half
    of what fits, plus one word where they alone are reserved."""
    folded = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode().lower()
    plain = "-".join(re.findall(r"[a-z0-9]+", folded))
    core, _, last = slug.rpartition("-")
    if not (core in rules["reserved"] and last):
        core = slug
    return plain.startswith(core) and len(core) >= min(len(plain), rules["max_length"]) // 2

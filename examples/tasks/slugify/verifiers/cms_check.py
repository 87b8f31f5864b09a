"""The CMS's own acceptance check: every slug it would store must obey its rules.

Called by the grader inside the grading sandbox as ``score(workdir)``; returns the component
"cms" in [0, 1]: the fraction of sample titles whose slug the CMS accepts.
"""

import json
import re
import sys
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
        accepted += ok
    return {"cms": accepted / len(TITLES)}

import json
import re
import unicodedata
from pathlib import Path

RULES = json.loads((Path(__file__).parent / "cms_rules.json").read_text())


def slugify(title: str) -> str:
    """A URL slug for ``title``."""
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    words = re.findall(r"[a-z0-9]+", ascii_title.lower())
    slug = "-".join(words)[: RULES["max_length"]].strip("-")
    if slug in RULES["reserved"]:
        slug += "-page"
    return slug

def slugify(title: str) -> str:
    """A URL slug for ``title``."""
    raise NotImplementedError

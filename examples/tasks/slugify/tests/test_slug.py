import pytest

from slug import slugify


@pytest.mark.parametrize(("title", "slug"), [
    ("Hello World", "hello-world"),
    ("  Spaces   everywhere  ", "spaces-everywhere"),
    ("Café Déjà Vu", "cafe-deja-vu"),
    ("C'est la vie!", "c-est-la-vie"),
    ("2024: a year", "2024-a-year"),
])
def test_slugify(title, slug):
    assert slugify(title) == slug


def test_no_edge_hyphens():
    assert slugify("--odd--") == "odd"

"""``mypkg.models:make_model``: a reader's model factory as the README's snippets name it."""

from docs_stand_ins import make_model  # noqa: F401 - the factory the import path names

"""The stand-in for a reader's own package in the README's "Your own model" snippets
(``model_factory="mypkg.models:make_model"``)."""

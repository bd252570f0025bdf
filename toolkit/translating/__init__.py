"""A trained model in use, for test.py, translate.py, export.py and serve.py: loaded one way
(trained_model), decoding held open (translator), text in and out (sentences, documents), attention
plots, and the model as CTranslate2 and Argos packages."""

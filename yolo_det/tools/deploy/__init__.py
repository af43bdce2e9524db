"""Deploy checks: does an image's prediction depend on its batch (:mod:`.check`), and comparing export
records (:mod:`.records`)."""

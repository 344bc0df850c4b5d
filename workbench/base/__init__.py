"""What every part of the workbench stands on, and nothing a run does: the errors it raises
(`errors`), the checks of a public function's arguments (`arguments`) and of a dataset's labels
(`label_range`), the tables everything prints (`report`), the precisions' names and dtypes
(`precisions`), a file written whole or not at all (`atomic_write`) and the course's notebooks
copied out of a wheel (`course_files`). It imports no other part (tests/test_layers.py).
"""

"""The old name of export/serving_file.py, kept only until eval/stage.py and
integrations/trl.py (edited by others while it moved) import serving_file; then delete it."""

from draftkit.export.serving_file import SERVING_FILE, apply_choice, keep_choice  # noqa: F401

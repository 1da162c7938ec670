"""Environments from episode libraries, registered as the ``environment`` plugin kind."""

"""The ``smqp`` command-line client (``[project.scripts]``): a plain SMQP client over the
codec, with no Django and no server code (import-linter contract ``cli-is-a-client``)."""

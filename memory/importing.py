"""The import's entry point for the application: reading an import file and its handle mappings
(memory/import_file.py) into the items the worker applies.

The application checks the file here and sends the items to the worker as ``memory.import``
owner commands; the worker applies them as the one writer (memory/importer.py, through
memory/commands.py). Nothing here touches the database.
"""

from memory.import_file import Mapping, Parsed, parse_file, parse_mapping

__all__ = ["Mapping", "Parsed", "parse_file", "parse_mapping"]

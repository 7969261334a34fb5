"""The REST API's JSON parser: DRF's, made to answer a 400 in the API's error shape for input
that would otherwise fail deeper down (chat/text.py says which)."""

from __future__ import annotations

from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError
from rest_framework.utils import json

from chat.text import json_object_unique, json_text_problem


class JSONParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            # UTF-8 whatever `charset` the Content-Type names (JSON is UTF-8, RFC 8259): with
            # `charset=latin-1` a valid UTF-8 body was stored garbled ("cafÃ©") and a Latin-1
            # one accepted. NaN and Infinity refused, as DRF's STRICT_JSON does.
            data = json.loads(
                stream.read().decode("utf-8"),
                parse_constant=json.strict_constant,
                object_pairs_hook=json_object_unique,
            )
        except RecursionError:
            # A document nested thousands of levels deep ([[[[...) exhausts the decoder.
            raise ParseError("JSON parse error - nested too deeply") from None
        except ValueError as exc:  # bad JSON, or bytes that are not UTF-8
            raise ParseError(f"JSON parse error - {exc}") from None
        problem = json_text_problem(data)
        if problem:
            raise ParseError(f"Invalid text: {problem}.")
        return data

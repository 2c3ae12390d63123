"""Validates an OpenAPI document with openapi-spec-validator (an independent implementation of
the OpenAPI 3.1 schema). Usage: validate_openapi.py FILE. Prints {"valid": true, "version": ...}
or {"valid": false, "errors": [...]}; exits 0 either way (the test decides)."""

import json
import sys

from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

with open(sys.argv[1]) as f:
    doc = json.load(f)
try:
    validate(doc)
    print(json.dumps({"valid": True, "version": doc.get("openapi")}))
except OpenAPIValidationError as e:
    print(json.dumps({"valid": False, "errors": [str(e)]}))

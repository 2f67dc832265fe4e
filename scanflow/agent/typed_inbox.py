"""The typed inbox: POST /events checks an event against the payload model its agent declared.

Why here and not in each handler: a malformed event refused at the door gets a 422 naming the field to
the sender, who can fix it; accepted and failing later in an actuator, it would only be a failed action
in the receiver's log. Agents declare the models with `Agent(messages={name: model})`; an agent that
declares none keeps an untyped inbox (every JSON object accepted, as before).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

REF = "#/components/schemas/{model}"


class TypedInbox:
    """The payload validators of one agent's declared messages."""

    def __init__(self, agent_name: str, messages: Mapping[str, Any]) -> None:
        self.agent = agent_name
        self.models = dict(messages)
        self._adapters = {name: TypeAdapter(model) for name, model in self.models.items()}

    def check(self, name: str, payload: dict[str, Any]) -> None:
        """Raise RequestValidationError (a 422) when this agent declares messages and the event is not
        one of them, or its payload does not fit the event's model."""
        if not self.models:
            return
        adapter = self._adapters.get(name)
        if adapter is None:
            raise RequestValidationError([{
                "loc": ("body", "name"), "type": "unknown_event",
                "msg": f"agent {self.agent!r} takes no event {name!r}: it takes {sorted(self.models)}"}])
        try:
            adapter.validate_python(payload)
        except ValidationError as exc:
            raise RequestValidationError([
                {**e, "loc": ("body", "payload", *e["loc"])}
                for e in exc.errors(include_url=False, include_input=False)]) from None

    def document(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The OpenAPI document with each declared model under components/schemas, and POST /events's body
        as one variant per declared event (its name, and its payload's model)."""
        if not self.models:
            return doc
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        post = doc.get("paths", {}).get("/events", {}).get("post")
        generic = None
        if post is not None:
            generic = post.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        base = schemas.get(generic["$ref"].rsplit("/", 1)[-1]) if generic and "$ref" in generic else None
        variants = []
        for name, adapter in sorted(self._adapters.items()):
            schema = adapter.json_schema(ref_template=REF)
            schemas.update(schema.pop("$defs", {}))
            title = getattr(self.models[name], "__name__", None) or _title(name)
            schemas[title] = schema
            variant: dict[str, Any] = copy.deepcopy(base) if base else {"type": "object", "properties": {}}
            variant["title"] = f"{_title(name)[:-len('Payload')]}Event"
            properties: dict[str, Any] = variant["properties"]
            properties["name"] = {"const": name, "type": "string"}
            properties["payload"] = {"$ref": REF.format(model=title)}
            variant["required"] = sorted({*variant.get("required", []), "name", "payload"})
            variants.append(variant)
        if post is not None:
            post["requestBody"]["content"]["application/json"]["schema"] = {"oneOf": variants}
            post["description"] = (post.get("description", "") + "\n\nThis agent takes only these events, each "
                                   "with its payload's model (a 422 names what does not fit): "
                                   + ", ".join(f"`{n}`" for n in sorted(self.models))).strip()
        return doc


def _title(event: str) -> str:
    """`plan.approved` -> `PlanApprovedPayload`: a schema name for a model without one (an annotated union)."""
    return "".join(part.capitalize() for part in event.replace(":", ".").replace("/", ".").replace("-", ".")
                   .replace("_", ".").split(".")) + "Payload"

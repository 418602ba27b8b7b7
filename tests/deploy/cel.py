"""A ValidatingAdmissionPolicy's CEL evaluated as the API server does, with cel-python (`celpy`):
matchConditions first (no match: the policy does not apply), then the variables in order, then every
validation; an evaluation error denies, as failurePolicy Fail does. Kubernetes' `join` string-list
extension is supplied here."""

from __future__ import annotations

from typing import Any

import celpy  # cel-python, from the test extra
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

Obj = dict[str, Any]


def _join(items: Any, separator: Any = "") -> Any:
    return celtypes.StringType(str(separator).join(str(i) for i in items))


class Policy:
    def __init__(self, spec: Obj) -> None:
        self.env = celpy.Environment()
        self.spec = spec
        self.compiled: dict[str, Any] = {}

    def program(self, expression: str) -> Any:
        if expression not in self.compiled:
            self.compiled[expression] = self.env.program(self.env.compile(expression), functions={"join": _join})
        return self.compiled[expression]

    def admit(self, request: Obj, obj: Obj | None, old: Obj | None) -> tuple[bool, list[str]]:
        """(allowed, denial messages) the API server would answer."""
        activation: dict[str, Any] = {"request": json_to_cel(request), "object": json_to_cel(obj),
                                      "oldObject": json_to_cel(old)}
        for condition in self.spec["matchConditions"]:
            if not self.program(condition["expression"]).evaluate(activation):
                return True, []
        variables: dict[Any, Any] = {}
        try:
            for variable in self.spec["variables"]:
                activation["variables"] = celtypes.MapType(variables)
                value = self.program(variable["expression"]).evaluate(activation)
                variables[celtypes.StringType(variable["name"])] = value
            activation["variables"] = celtypes.MapType(variables)
            messages = []
            for validation in self.spec["validations"]:
                if not self.program(validation["expression"]).evaluate(activation):
                    message = validation.get("message")
                    if "messageExpression" in validation:
                        message = str(self.program(validation["messageExpression"]).evaluate(activation))
                    messages.append(message)
        except CELEvalError as e:
            return False, [f"evaluation error: {e}"]  # failurePolicy: Fail
        return not messages, messages

"""A ValidatingAdmissionPolicy's CEL evaluated as the API server does, with cel-python (`celpy`):
matchConditions first (no match: the policy does not apply), then the variables in order, then every
validation; an evaluation error denies, as failurePolicy Fail does. Kubernetes' `join` string-list
extension is supplied here.

And a DeviceClass's selectors evaluated on a ResourceSlice's device as the scheduler does
(`DeviceClassSelector`): the device's driver, and its attributes and capacities by domain."""

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


def cel_device(driver: str, device: Obj) -> Any:
    """A published device as a selector sees it: ``device.driver``, ``device.attributes[domain][name]``
    (the value of {"string": ...}, {"int": ...}, ...), ``device.capacity[domain][name]`` (the quantity's
    text); a name without a domain is the driver's."""
    by_domain: dict[str, dict[str, dict[str, Any]]] = {"attributes": {}, "capacity": {}}
    for field, domains in by_domain.items():
        for name, value in device.get(field, {}).items():
            domain, _, short = name.rpartition("/")
            plain = value["value"] if field == "capacity" else next(iter(value.values()))
            domains.setdefault(domain or driver, {})[short] = plain
    return json_to_cel({"driver": driver, **by_domain})


class DeviceClassSelector:
    """A DeviceClass's selectors: a device belongs to the class when every one is true."""

    def __init__(self, device_class: Obj) -> None:
        env = celpy.Environment()
        self.programs = [env.program(env.compile(s["cel"]["expression"])) for s in device_class["spec"]["selectors"]]

    def selects(self, driver: str, device: Obj) -> bool:
        """True or False; CELEvalError (the scheduler: the allocation fails) when one cannot be evaluated."""
        activation = {"device": cel_device(driver, device)}
        for program in self.programs:
            result = program.evaluate(activation)
            if isinstance(result, CELEvalError):
                raise result
            if not result:
                return False
        return True

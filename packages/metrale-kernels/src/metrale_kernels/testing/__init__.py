"""Harnesses the tests and the device checks share: backends against their references on
random inputs. Nothing outside this subpackage imports it: it is not part of serving."""

"""The Kubernetes grammars of names, labels and identities, checked where a value enters hpc-bridge.

One rule for hostile input (README "Security"): a name or identity is validated against the grammar of the
system it comes from when it is read, on every path (YAML files, stdin, converted batch scripts, the cluster
config, objects from the API server), so no renderer ever meets a value that could end a line, a quote or a
directive. The grammars are Kubernetes' own (``k8s.io/apimachinery/pkg/util/validation``):

* RFC 1123 label (namespaces, container names): ``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, at most 63;
* RFC 1123 subdomain (object names, runtime and cluster names): dot-separated labels, at most 253;
* RFC 1035 label (TrainJob names): an RFC 1123 label that starts with a letter;
* label keys / qualified names: ``[prefix/]name``, prefix a subdomain, name at most 63 of
  ``[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?``; label values: empty or such a name;
* uid: Kubernetes treats ``metadata.uid`` as free-form text the API server generates (a UUID). hpc-bridge
  writes it into Slurm comments, Flux attributes and a Kubernetes label, so it admits only what such a label
  value admits: 1 to 63 of letters, digits, ``-``, ``_`` and ``.``, starting and ending with a letter or
  digit. Every UUID passes; anything else is refused, not rewritten.
"""

from __future__ import annotations

import re

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
LABEL_VALUE_MAX = 63
UID_MAX = 63
#: Kubernetes' limit on the total size of an object's annotations (keys and values), in bytes
ANNOTATIONS_MAX_BYTES = 256 * 1024

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(_LABEL)
DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
QUALIFIED_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
UID = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
#: a POSIX-portable user name (what Slurm and sshd accept in practice)
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")
#: a host name (RFC 1123, any case), an IPv4 address, or an IPv6 address in brackets or bare
HOST_NAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*"
                       r"|\[?[0-9A-Fa-f:.]+(%[A-Za-z0-9]+)?\]?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def check_dns1123_label(value: str) -> str:
    if len(value) > DNS1123_LABEL_MAX:
        raise ValueError(f"must be at most {DNS1123_LABEL_MAX} characters (has {len(value)})")
    if not DNS1123_LABEL.fullmatch(value):
        raise ValueError("must be an RFC 1123 label: lowercase letters, digits and '-', starting and ending with a "
                         "letter or digit")
    return value


def check_dns1123_subdomain(value: str) -> str:
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        raise ValueError(f"must be at most {DNS1123_SUBDOMAIN_MAX} characters (has {len(value)})")
    if not DNS1123_SUBDOMAIN.fullmatch(value):
        raise ValueError("must be an RFC 1123 subdomain: lowercase letters, digits, '-' and '.', starting and "
                         "ending with a letter or digit")
    return value


def check_dns1035_label(value: str) -> str:
    if len(value) > DNS1123_LABEL_MAX:
        raise ValueError(f"must be at most {DNS1123_LABEL_MAX} characters (has {len(value)})")
    if not DNS1035_LABEL.fullmatch(value):
        raise ValueError("must be an RFC 1035 DNS label: lowercase letters, digits and '-', starting with a letter")
    return value


def check_qualified_name(key: str, what: str = "label key") -> str:
    """``[prefix/]name`` as Kubernetes checks label keys, annotation keys and finalizers."""
    prefix, slash, name = key.rpartition("/")
    if slash:
        if not prefix:
            raise ValueError(f"{what} {_show(key)}: the prefix before '/' must not be empty")
        if len(prefix) > DNS1123_SUBDOMAIN_MAX or not DNS1123_SUBDOMAIN.fullmatch(prefix):
            raise ValueError(f"{what} {_show(key)}: the prefix must be an RFC 1123 subdomain (lowercase letters, "
                             "digits, '-' and '.')")
    if not name or len(name) > 63 or not QUALIFIED_NAME_PART.fullmatch(name):
        raise ValueError(f"{what} {_show(key)}: the name must be 1 to 63 letters, digits, '-', '_' or '.', "
                         "starting and ending with a letter or digit")
    return key


def check_label_value(value: str, key: str = "") -> str:
    if value and (len(value) > LABEL_VALUE_MAX or not QUALIFIED_NAME_PART.fullmatch(value)):
        where = f"label {key}: " if key else ""
        raise ValueError(f"{where}value {_show(value)} must be at most 63 letters, digits, '-', '_' or '.', "
                         "starting and ending with a letter or digit (or empty)")
    return value


def check_labels(labels: dict[str, str] | None) -> dict[str, str] | None:
    for key, value in (labels or {}).items():
        check_qualified_name(key)
        check_label_value(value, key)
    return labels


def check_annotations(annotations: dict[str, str] | None) -> dict[str, str] | None:
    total = 0
    for key, value in (annotations or {}).items():
        check_qualified_name(key, "annotation key")
        total += len(key.encode()) + len(value.encode())
    if total > ANNOTATIONS_MAX_BYTES:
        raise ValueError(f"annotations may hold at most {ANNOTATIONS_MAX_BYTES} bytes in all (have {total})")
    return annotations


def check_uid(value: str) -> str:
    if len(value) > UID_MAX or not UID.fullmatch(value):
        raise ValueError(f"hpc-bridge admits uids of 1 to {UID_MAX} letters, digits, '-', '_' or '.', starting and "
                         "ending with a letter or digit (a UUID, as the API server makes them)")
    return value


def check_user_name(value: str) -> str:
    if not USER_NAME.fullmatch(value):
        raise ValueError("must be a user name: letters, digits, '_', '.' and '-', starting with a letter or '_' "
                         "(at most 32)")
    return value


def check_host(value: str) -> str:
    if not HOST_NAME.fullmatch(value):
        raise ValueError("must be a host name or an IP address")
    return value


def check_one_line(value: str, what: str = "value") -> str:
    """Free text that is written into a file or a command line: no control characters and no line separators."""
    if _CONTROL.search(value):
        raise ValueError(f"{what} must be one line without control characters")
    return value


def has_control(value: str) -> bool:
    return bool(_CONTROL.search(value))


def _show(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 70 else text[:67] + "..."

"""cadau/logins.py address_key: which addresses the login rate and lockout count as one client
(tests/test_limits.py drives them through the login routes)."""

from __future__ import annotations

import pytest

from cadau import logins


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("10.0.0.1", "10.0.0.1"),
        ("2001:db8:1:2:a:b:c:d", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        # Addresses that carry an IPv4 one count as it: IPv4-mapped; 6to4 (an IPv4 address
        # holds 65,536 /64s); Teredo (the client's address, not its relay's); NAT64 (every
        # IPv4 client behind the translator would otherwise be one /64).
        ("::ffff:10.4.0.1", "10.4.0.1"),
        ("2002:c000:204::1", "192.0.2.4"),
        ("2002:c000:204:ffff::1", "192.0.2.4"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45"),
        ("64:ff9b::192.0.2.33", "192.0.2.33"),
        ("unknown", "unknown"),
        ("x" * 5000, "x" * 5000),
    ],
)
def test_address_keys(address, key):
    kept = logins._address_key.cache_info().currsize
    assert logins.address_key(address) == key
    # What is too long to be an address is not parsed, nor kept in the parse cache.
    if len(address) > logins._ADDRESS_RUNES_MAX:
        assert logins._address_key.cache_info().currsize == kept

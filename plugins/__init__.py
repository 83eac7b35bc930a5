"""Optional integrations hooked into leasekit through pluggy (entry points ``leasekit.plugins``)."""

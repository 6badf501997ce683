"""Name-keyed class registries (layers, solvers, codecs, allreduce algorithms)."""


def registrar(table, kind, attribute):
    """A class-decorator factory: ``@register(name)`` stores the class in ``table[name]``, sets
    ``cls.<attribute> = name`` and refuses a name registered twice (a ValueError naming both
    modules), so two modules can never silently shadow each other."""
    def register(name):
        def deco(cls):
            if name in table:
                raise ValueError(f"{kind} {name!r} registered twice "
                                 f"({table[name].__module__} and {cls.__module__})")
            setattr(cls, attribute, name)
            table[name] = cls
            return cls
        return deco
    return register

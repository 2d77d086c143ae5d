"""Federation links (profile §9.5): the door through which this server is an SMQP client of
its peers. :mod:`.link` keeps one link's session; :mod:`.supervisor` keeps one session per
enabled link (``manage.py runlinks``, started by ``manage.py runbroker``). The rules are
:mod:`broker.services.federation`'s."""

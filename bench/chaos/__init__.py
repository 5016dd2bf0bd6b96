"""python -m bench.chaos [--minutes N] [--seed S]: the chaos soak of the whole hub, with real parts only.

Usage::

    python -m bench.chaos                   # 10 minutes of chaos, then drain, the Spark job and the verdict
    python -m bench.chaos --minutes 2 --seed 7 --keep /tmp/chaos   # keep data, landing, lake and logs

What runs (``bench.chaos.run``):

* the hub as users run it, ``edgehub run`` as a subprocess (plain MQTT and plain AMQP on free ports, duplicate
  detection on), with routes at priorities 0, 2 and 5 to ``$upstream`` (priority 2 with a 10 s TTL, so some
  messages expire) and the priority-5 class also to a module's input;
* four paho devices publishing QoS 1 and two proton devices publishing over AMQP (10 msg/s each, in bursts of 5
  on one clock grid), each message numbered per device and carrying its class; a device re-sends what it had no
  PUBACK (or ``accepted``) for after every reconnect (``bench.chaos.clients``);
* a module consumer (paho, connected as ``edge/consumer``) recording what reaches its input and answering direct
  methods, and a command device (``cmd-0``) receiving cloud-to-device messages and answering direct methods;
* the cloud (``bench.chaos.cloud``), a paho client on the cloud Mosquitto sending cloud-to-device messages to the
  command device and calling methods on it and on the module (some never answered, so the hub must time them
  out); the hub's RSS read every second;
* the upstream (``--upstream-mqtt``, batch mode) through ``edgehub.testing.linksim.LinkSim`` to a cloud
  Mosquitto, where the landing receiver (``python -m spark_upload.receiver``) lands each segment;
* a seeded schedule (``bench.chaos.schedule``) of SIGKILLs of the hub (each aimed 0-20 ms after a burst, while
  the hub writes and acks it; restarted on the same data directory), silent and hard link outages and rate
  changes between 32 kbit/s and 1 Mbit/s;
* at the end: publishing stops, the link comes back at 1 Mbit/s, the run waits (bounded) until every
  acknowledged message arrived or its TTL surely passed, stops the hub, runs the Spark job once
  (``--trigger available-now --master local[2]``) over the landing zone, and reads the bronze table
  (``bench.chaos.lake``, its own Spark process);
* the verifier (``bench.chaos.verify``, whose docstring gives each rule) compares every acknowledged message
  with the lake and the module: delivered, expired (TTL arithmetic), lost, duplicates in the lake, order within
  each device's priority lane (by ``enqueued_at`` in bronze and by line order in the landing zone's segments),
  and the module's first arrivals in each device's order; ``bench.chaos.verify_cloud`` checks that every
  cloud-to-device message reached its device and every method call was answered with a status it can have had.

Last line: one JSON object with ``acknowledged``, ``delivered``, ``expired``, ``lost``, ``duplicates``,
``order_violations``, ``kills`` (then ``module_order_violations``, ``c2d_lost``, ``methods_wrong``,
``hub_rss_peak_mib``, ``resent``, timings and more). Every process it starts runs in its own process group and
is killed on the way out, also on failure, SIGTERM or Ctrl-C.
"""

"""spanner-cdc: Cloud Spanner change streams → Kafka → Spark sinks (see docs/design.md §8 for
the layers: cli > demo, reference > stack > producer | consumer > common > schemas > errors)."""

import os

# gRPC's fork handlers restart its poller in a forked child; when the child then closes its
# descriptors before exec (subprocess with preexec_fn: pyspark starts Spark's JVM that way), the
# poller can abort the child with "epoll_wait error: Bad file descriptor" (grpc/grpc#43055,
# grpcio >= 1.81; about 1 launch in 25 with a live channel, measured). Nothing here forks without
# exec, so the handlers are not needed. gRPC reads the setting once, when it is first imported,
# which is why it is set in the package every entry point imports first; a user's own setting wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

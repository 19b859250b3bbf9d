//! xroce's librdmacm.so.1 (see abi/standins/tests/support.rs, shared with the stand-ins, for what each check does and what
//! it needs): its soname and version nodes, that it exports every `symbol@version` perftest
//! and pyverbs import from it (and everything the real librdmacm.so.1 exports), that each stub
//! of its table fails as the table says, that a C program linked against it gets
//! `rdma_event_str`'s names and, with rdma-core's libibverbs loaded instead of xroce's, a
//! clean failure from the forwarded calls, and that perftest and pyverbs load it in place of
//! rdma-core's. The forwarded calls themselves run in tools/tests/rdmacm_netns.rs.
#[path = "../../standins/tests/support.rs"]
#[macro_use]
mod support;

use support::Lib;

const LIB: Lib = Lib {
    soname: "librdmacm.so.1",
    file: "libxroce_rdmacm.so",
    node_prefix: "RDMACM_",
    source: include_str!("../src/lib.rs"),
    headers: &["rdma/rdma_cma.h", "rdma/rdma_verbs.h", "rdma/rsocket.h"],
};

standin_tests!(
    LIB,
    imports: 21, 32,
    linked: LINKED,
    said: &[
        "xroce: rdma_create_event_channel is not supported: xroce's librdmacm.so.1 needs xroce's libibverbs.so.1, and the one loaded is not (xroce run puts both first on LD_LIBRARY_PATH)",
        "xroce: rdma_create_id is not supported: xroce's librdmacm.so.1 needs xroce's libibverbs.so.1, and the one loaded is not (xroce run puts both first on LD_LIBRARY_PATH)",
        "xroce: rdma_join_multicast is not supported: xroce's RDMA CM does not implement it (docs/rdmacm.md)",
    ],
);

/// Calls a few of the library's functions with their C signatures and checks the results
/// (`LD_LIBRARY_PATH` holds the stand-ins only: the libibverbs loaded is rdma-core's).
const LINKED: &str = r#"
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failed;
#define CHECK(cond)                                      \
	do {                                             \
		if (cond) {                              \
			printf("ok: %s\n", #cond);       \
		} else {                                 \
			printf("FAILED: %s\n", #cond);   \
			failed = 1;                      \
		}                                        \
	} while (0)

struct rdma_event_channel;
struct rdma_cm_id;
struct rdma_event_channel *rdma_create_event_channel(void);
void rdma_destroy_event_channel(struct rdma_event_channel *channel);
int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context, int ps);
const char *rdma_event_str(int event);
uint16_t rdma_get_src_port(struct rdma_cm_id *id);
int rdma_join_multicast(struct rdma_cm_id *id, void *addr, void *context);

int main(void)
{
	int err;

	for (int call = 0; call < 2; call++) {
		errno = 0;
		struct rdma_event_channel *channel = rdma_create_event_channel();
		err = errno;
		CHECK(channel == NULL);
		CHECK(err == EOPNOTSUPP);
	}
	struct rdma_cm_id *id = NULL;
	errno = 0;
	int ret = rdma_create_id(NULL, &id, NULL, 0x0106);
	err = errno;
	CHECK(ret == -1);
	CHECK(err == EOPNOTSUPP);
	CHECK(id == NULL);
	CHECK(strcmp(rdma_event_str(0), "RDMA_CM_EVENT_ADDR_RESOLVED") == 0);
	CHECK(strcmp(rdma_event_str(9), "RDMA_CM_EVENT_ESTABLISHED") == 0);
	CHECK(strcmp(rdma_event_str(15), "RDMA_CM_EVENT_TIMEWAIT_EXIT") == 0);
	CHECK(strcmp(rdma_event_str(16), "UNKNOWN EVENT") == 0);
	CHECK(strcmp(rdma_event_str(-1), "UNKNOWN EVENT") == 0);
	errno = 0;
	ret = rdma_join_multicast(NULL, NULL, NULL);
	err = errno;
	CHECK(ret == -1);
	CHECK(err == EOPNOTSUPP);
	if (!failed)
		printf("all checks passed\n");
	return failed;
}
"#;

//! The stand-in libefa.so.1 (see abi/standins/tests/support.rs for what each check does and what it
//! needs): its soname and version nodes, that it exports every `symbol@version` perftest
//! and pyverbs import from it (and everything the real libefa.so.1 exports), that each stub fails
//! as its table says, that a C program linked against it gets its failure values, and that
//! perftest and pyverbs load it in place of rdma-core's.
#[path = "../../tests/support.rs"]
#[macro_use]
mod support;

use support::Lib;

const LIB: Lib = Lib {
    soname: "libefa.so.1",
    file: "libxroce_efa.so",
    node_prefix: "EFA_",
    source: include_str!("../src/lib.rs"),
    headers: &["infiniband/efadv.h"],
};

standin_tests!(
    LIB,
    imports: 2, 6,
    linked: LINKED,
    said: &[
            "xroce: efadv_create_qp_ex is not supported: xroce's devices are not EFA devices",
        ],
);

/// Calls a few of the library's functions with their C signatures and checks the results.
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

struct ibv_context;
struct ibv_qp;
struct efadv_device_attr;
int efadv_query_device(struct ibv_context *ibvctx, struct efadv_device_attr *attr, uint32_t inlen);
struct ibv_qp *efadv_create_qp_ex(struct ibv_context *ibvctx, void *attr_ex, void *efa_attr, uint32_t inlen);

int main(void)
{
	int err;

	for (int call = 0; call < 2; call++) {
		errno = 0;
		int ret = efadv_query_device(NULL, NULL, 0);
		err = errno;
		CHECK(ret == EOPNOTSUPP);
		CHECK(err == EOPNOTSUPP);
	}
	errno = 0;
	struct ibv_qp *qp = efadv_create_qp_ex(NULL, NULL, NULL, 0);
	err = errno;
	CHECK(qp == NULL);
	CHECK(err == EOPNOTSUPP);
	if (!failed)
		printf("all checks passed\n");
	return failed;
}
"#;

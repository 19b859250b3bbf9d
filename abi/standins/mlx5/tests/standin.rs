//! The stand-in libmlx5.so.1 (see abi/standins/tests/support.rs for what each check does and what it
//! needs): its soname and version nodes, that it exports every `symbol@version` perftest
//! and pyverbs import from it (and everything the real libmlx5.so.1 exports), that each stub fails
//! as its table says, that a C program linked against it gets its failure values, and that
//! perftest and pyverbs load it in place of rdma-core's.
#[path = "../../tests/support.rs"]
#[macro_use]
mod support;

use support::Lib;

const LIB: Lib = Lib {
    soname: "libmlx5.so.1",
    file: "libxroce_mlx5.so",
    node_prefix: "MLX5_",
    source: include_str!("../src/lib.rs"),
    headers: &["infiniband/mlx5dv.h"],
};

standin_tests!(
    LIB,
    imports: 9, 80,
    linked: LINKED,
    said: &[
            "xroce: mlx5dv_open_device is not supported: xroce's devices are not mlx5 devices",
            "xroce: mlx5dv_query_device is not supported: xroce's devices are not mlx5 devices",
            "xroce: mlx5dv_init_obj is not supported: xroce's devices are not mlx5 devices",
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

struct ibv_device;
struct ibv_context;
struct mlx5dv_context;
struct mlx5dv_obj;
bool mlx5dv_is_supported(struct ibv_device *device);
struct ibv_context *mlx5dv_open_device(struct ibv_device *device, void *attr);
int mlx5dv_query_device(struct ibv_context *ctx, struct mlx5dv_context *attrs);
int mlx5dv_init_obj(struct mlx5dv_obj *obj, uint64_t obj_type);

int main(void)
{
	int err;

	for (int call = 0; call < 2; call++) {
		errno = 0;
		bool supported = mlx5dv_is_supported(NULL);
		err = errno;
		CHECK(!supported);
		CHECK(err == EOPNOTSUPP);
	}
	errno = 0;
	struct ibv_context *ctx = mlx5dv_open_device(NULL, NULL);
	err = errno;
	CHECK(ctx == NULL);
	CHECK(err == EOPNOTSUPP);
	int ret = mlx5dv_query_device(NULL, NULL);
	CHECK(ret == EOPNOTSUPP);
	ret = mlx5dv_init_obj(NULL, 0);
	CHECK(ret == EOPNOTSUPP);
	if (!failed)
		printf("all checks passed\n");
	return failed;
}
"#;

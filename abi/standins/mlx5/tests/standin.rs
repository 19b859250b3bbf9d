//! The stand-in libmlx5.so.1 (see abi/standins/tests/support.rs for what each check does and what it
//! needs): its soname and version nodes, that it exports every `symbol@version` perftest
//! and pyverbs import from it (and everything the real libmlx5.so.1 exports), that each stub fails
//! as its table says, that a C program linked against it gets its failure values, and that
//! perftest and pyverbs load it in place of rdma-core's.
#[path = "../../tests/support.rs"]
mod support;

use support::Lib;

const LIB: Lib = Lib {
    soname: "libmlx5.so.1",
    file: "libxroce_mlx5.so",
    node_prefix: "MLX5_",
    source: include_str!("../src/lib.rs"),
    headers: &["infiniband/mlx5dv.h"],
};

#[test]
fn soname_and_version_nodes() {
    support::check_soname_and_nodes(&LIB);
}

#[test]
fn exports_what_perftest_and_pyverbs_import() {
    support::check_exports_cover_imports(&LIB, 9, 80);
}

#[test]
fn exports_what_the_real_library_exports() {
    support::check_exports_match_real_library(&LIB);
}

#[test]
fn kinds_match_the_headers() {
    support::check_kinds_match_headers(&LIB);
}

#[test]
fn every_stub_fails_as_its_table_says() {
    support::check_every_stub_fails(&LIB);
}

#[test]
fn c_program_linked_against_it() {
    support::check_linked_program(
        &LIB,
        LINKED,
        &[
            "xroce: mlx5dv_is_supported is not supported: xroce's devices are not mlx5 devices",
            "xroce: mlx5dv_open_device is not supported: xroce's devices are not mlx5 devices",
            "xroce: mlx5dv_query_device is not supported: xroce's devices are not mlx5 devices",
            "xroce: mlx5dv_init_obj is not supported: xroce's devices are not mlx5 devices",
        ],
    );
}

#[test]
fn perftest_loads_the_standin() {
    support::check_perftest_loads(&LIB);
}

#[test]
fn pyverbs_modules_import() {
    support::check_pyverbs_imports(&LIB);
}

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

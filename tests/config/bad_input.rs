//! Bad input gives clear errors: a table of malformed hostfiles, addresses and environment values, one test per row.
//!
//! Each row names the input and the fragments its error message must contain: the file, the
//! rank and address index, and what is wrong. The environment rows are unit tests of the
//! crate-private `env` module (`src/config/env.rs`), which an integration test cannot reach.

use std::path::PathBuf;

use nuvec_distributed::Error;
use nuvec_distributed::hostfile::{parse, read, resolve, split_address};

/// The message of a configuration error; anything else fails the test.
fn message<T: std::fmt::Debug, E: Into<Error>>(r: Result<T, E>) -> String {
    match r.map_err(Into::into) {
        Err(Error::Config(m)) => m.to_string(),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

fn check(m: &str, fragments: &[&str]) {
    for f in fragments {
        assert!(m.contains(f), "missing {f:?} in {m:?}");
    }
}

/// `parse(text, "hosts.json")` fails with a message containing every fragment.
macro_rules! bad_hostfile {
    ($($name:ident: $text:expr => [$($frag:expr),+ $(,)?];)+) => {$(
        #[test]
        fn $name() {
            let m = message(parse($text, "hosts.json"));
            check(&m, &["hostfile hosts.json: ", $($frag),+]);
        }
    )+};
}

/// `split_address(addr)` and `resolve(addr)` both fail with a message containing every
/// fragment (and the quoted address).
macro_rules! bad_address {
    ($($name:ident: $addr:expr => [$($frag:expr),+ $(,)?];)+) => {$(
        #[test]
        fn $name() {
            let quoted = format!("address {:?}: ", $addr);
            let m = message(split_address($addr));
            check(&m, &[&quoted, $($frag),+]);
            let m = message(resolve($addr));
            check(&m, &[&quoted, $($frag),+]);
        }
    )+};
}

bad_hostfile! {
    an_empty_file_mentions_the_single_host_case:
        "" => ["the file is empty", "mlx.launch writes an empty hostfile"];
    a_file_of_only_a_newline_is_empty:
        "\n" => ["the file is empty"];
    text_that_is_not_json_gives_line_and_column:
        "[[\"a:1\"],\n [\"b:2\"" => ["not valid JSON", "line 2 column"];
    a_single_quoted_list_is_not_json:
        "[['a:1']]" => ["not valid JSON", "expected value at line 1 column 3"];
    trailing_text_after_the_list_is_not_json:
        "[[\"a:1\"]] x" => ["not valid JSON", "trailing characters", "line 1 column 11"];
    a_trailing_comma_is_not_json:
        "[[\"a:1\"],]" => ["not valid JSON", "line 1 column"];
    an_object_is_not_a_list:
        r#"{"hosts": [["a:1"]]}"# => ["expected a JSON list", "found an object"];
    a_bare_string_is_not_a_list:
        r#""10.0.0.1:5000""# => ["expected a JSON list", "found a string"];
    an_empty_list_has_no_ranks:
        "[]" => ["the list of ranks is empty"];
    a_flat_list_of_strings_names_rank_zero:
        r#"["10.0.0.1:5000","10.0.0.2:5000"]"# => ["rank 0: expected a list of \"host:port\" strings, found a string"];
    a_null_entry_names_its_rank:
        r#"[["a:1"],null]"# => ["rank 1: expected a list", "found null"];
    an_object_entry_names_its_rank:
        r#"[["a:1"],["b:1"],{"ips":["c:1"]}]"# => ["rank 2: expected a list", "found an object"];
    an_empty_rank_entry_names_its_rank:
        r#"[["a:1"],[]]"# => ["rank 1: the list of addresses is empty"];
    a_number_address_names_rank_and_index:
        r#"[["a:1",5000]]"# => ["rank 0, address 1: expected a \"host:port\" string, found a number"];
    a_nested_list_address_names_rank_and_index:
        r#"[["a:1"],[["b:1"]]]"# => ["rank 1, address 0: expected a \"host:port\" string, found a list"];
    an_address_without_a_port_names_rank_and_index:
        r#"[["10.0.0.1:5000"],["10.0.0.2"]]"# => ["rank 1, address 0 \"10.0.0.2\": no port"];
    a_port_that_is_not_a_number_names_rank_and_index:
        r#"[["a:1","a:http"]]"# => ["rank 0, address 1 \"a:http\": the port \"http\" is not a number"];
    a_port_of_zero_names_rank_and_index:
        r#"[["a:1"],["b:0"]]"# => ["rank 1, address 0 \"b:0\": port 0 is not allowed"];
    a_port_above_65535_names_rank_and_index:
        r#"[["a:1"],["b:65536"]]"# => ["rank 1, address 0 \"b:65536\": port 65536 is out of range (1 to 65535)"];
    an_empty_host_names_rank_and_index:
        r#"[[":5000"]]"# => ["rank 0, address 0 \":5000\": the host before the ':' is empty"];
    an_empty_address_names_rank_and_index:
        r#"[["a:1"],[""]]"# => ["rank 1, address 0 \"\": the address is empty"];
    an_unbracketed_ipv6_address_names_rank_and_index:
        r#"[["::1:5000"]]"# => ["rank 0, address 0", "more than one ':'", "[::1]:5000"];
    fewer_addresses_on_a_later_rank_names_it_and_both_counts:
        r#"[["a:1","a:2"],["b:1","b:2"],["c:1"]]"# => ["rank 2 lists 1 address but rank 0 lists 2", "same number of addresses"];
    more_addresses_on_a_later_rank_names_it_and_both_counts:
        r#"[["a:1"],["b:1","b:2","b:3"]]"# => ["rank 1 lists 3 addresses but rank 0 lists 1"];
}

bad_address! {
    an_empty_address: "" => ["the address is empty"];
    an_address_without_a_colon: "10.0.0.1" => ["no port", "\"host:port\""];
    an_address_with_an_empty_port: "10.0.0.1:" => ["the port after the ':' is empty"];
    an_address_with_an_empty_host: ":5000" => ["the host before the ':' is empty"];
    a_port_with_letters: "10.0.0.1:50a0" => ["the port \"50a0\" is not a number"];
    a_negative_port: "10.0.0.1:-1" => ["the port \"-1\" is not a number"];
    a_port_of_zero: "10.0.0.1:0" => ["port 0 is not allowed"];
    a_port_of_65536: "10.0.0.1:65536" => ["port 65536 is out of range (1 to 65535)"];
    a_port_far_beyond_u16: "10.0.0.1:99999999999999999999" => ["out of range (1 to 65535)"];
    a_host_with_a_space: "node 1:5000" => ["whitespace"];
    a_trailing_newline_in_an_address: "10.0.0.1:5000\n" => ["whitespace"];
    an_unbracketed_ipv6_literal: "fe80::1:5000" => ["more than one ':'", "brackets"];
    an_unclosed_bracket: "[::1:5000" => ["'[' without a closing ']'"];
    brackets_around_something_that_is_not_ipv6: "[10.0.0.1]:5000" => ["[10.0.0.1] is not an IPv6 address"];
    a_bracketed_ipv6_literal_without_a_port: "[::1]" => ["no port after [::1]"];
    a_bracketed_ipv6_literal_with_an_empty_port: "[::1]:" => ["the port after the ':' is empty"];
    a_bracketed_ipv6_literal_with_port_zero: "[::1]:0" => ["port 0 is not allowed"];
}

#[test]
fn a_host_that_does_not_resolve_names_the_address_and_the_host() {
    // `.invalid` never resolves (RFC 6761).
    let m = message(resolve("no-such-host.invalid:5000"));
    check(
        &m,
        &[
            "address \"no-such-host.invalid:5000\": ",
            "cannot resolve the host \"no-such-host.invalid\"",
        ],
    );
}

/// A fresh path under Cargo's scratch directory for integration tests.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bad_input");
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    dir.join(name)
}

#[test]
fn a_missing_hostfile_names_the_path_and_the_io_error() {
    let path = scratch("does-not-exist.json");
    let _ = std::fs::remove_file(&path);
    let m = message(read(&path));
    check(
        &m,
        &[
            &format!("hostfile {}: cannot read the file: ", path.display()),
            "No such file",
        ],
    );
}

#[test]
fn a_directory_as_hostfile_names_the_path() {
    let path = scratch("a-directory");
    std::fs::create_dir_all(&path).expect("create the directory");
    let m = message(read(&path));
    check(
        &m,
        &[&format!(
            "hostfile {}: cannot read the file: ",
            path.display()
        )],
    );
}

#[test]
fn a_hostfile_that_is_not_utf8_names_the_path_and_the_offset() {
    let path = scratch("latin1.json");
    std::fs::write(&path, b"[[\"h\xe9te:1\"]]").expect("write the file");
    let m = message(read(&path));
    check(
        &m,
        &[
            &format!("hostfile {}: ", path.display()),
            "not UTF-8",
            "offset 4",
        ],
    );
}

#[test]
fn a_malformed_hostfile_read_from_disk_names_its_path_and_rank() {
    let path = scratch("unequal.json");
    std::fs::write(&path, "[[\"a:1\",\"a:2\"],[\"b:1\"]]\n").expect("write the file");
    let m = message(read(&path));
    check(
        &m,
        &[
            &format!("hostfile {}: ", path.display()),
            "rank 1 lists 1 address but rank 0 lists 2",
        ],
    );
}

#[test]
fn an_empty_hostfile_as_mlx_launch_writes_for_one_host_is_explained() {
    let path = scratch("empty.json");
    std::fs::write(&path, "\n").expect("write the file");
    let m = message(read(&path));
    check(
        &m,
        &[
            &format!("hostfile {}: the file is empty", path.display()),
            "only one host",
        ],
    );
}

#[test]
fn a_good_hostfile_written_like_mlx_launch_reads_back() {
    let path = scratch("good.json");
    std::fs::write(&path, "[[\"127.0.0.1:32323\"],[\"127.0.0.1:32324\"]]\n")
        .expect("write the file");
    let nodes = read(&path).expect("a good hostfile");
    assert_eq!(
        nodes,
        vec![
            vec!["127.0.0.1:32323".to_owned()],
            vec!["127.0.0.1:32324".to_owned()]
        ]
    );
}

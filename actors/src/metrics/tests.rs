use std::time::Duration;

use super::parse::parse;
use super::*;

#[test]
fn label_values_are_escaped_and_read_back() {
    let mut e = Exposition::new();
    e.family("artex_x", Type::Gauge, "A help with a \\ and\na newline.")
        .sample("artex_x", &[("kind", "a\"b\\c\nd")], 1.5);
    let text = e.finish();
    assert!(text.contains(r#"artex_x{kind="a\"b\\c\nd"} 1.5"#), "{text}");
    assert!(text.contains("# HELP artex_x A help with a \\\\ and\\na newline."));
    let samples = parse(&text).unwrap();
    assert_eq!(samples[0].labels["kind"], "a\"b\\c\nd");
}

#[test]
fn histogram_buckets_are_cumulative_with_sum_and_count() {
    let h = Histogram::new(&[0.1, 1.0]);
    for ms in [50, 60, 500, 2000] {
        h.observe(Duration::from_millis(ms));
    }
    let mut e = Exposition::new();
    e.family("artex_wait_seconds", Type::Histogram, "Waits.");
    e.histogram("artex_wait_seconds", &[("kind", "echo")], &h.snapshot());
    let text = e.finish();
    for line in [
        r#"artex_wait_seconds_bucket{kind="echo",le="0.1"} 2"#,
        r#"artex_wait_seconds_bucket{kind="echo",le="1"} 3"#,
        r#"artex_wait_seconds_bucket{kind="echo",le="+Inf"} 4"#,
        r#"artex_wait_seconds_sum{kind="echo"} 2.61"#,
        r#"artex_wait_seconds_count{kind="echo"} 4"#,
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    parse(&text).unwrap();
}

#[test]
fn an_observation_on_a_bound_falls_in_that_bucket() {
    let h = Histogram::new(&[1.0]);
    h.observe(Duration::from_secs(1));
    assert_eq!(h.snapshot().counts, vec![1, 0]);
}

#[test]
fn the_reader_refuses_what_prometheus_would() {
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n";
    parse(ok).unwrap();
    for (bad, why) in [
        ("a_total 1\n", "before any # TYPE"),
        ("# TYPE a_total counter\na_total 1\na_total 2\n", "twice"),
        ("# TYPE a counter\na 1\n", "not named"),
        ("# TYPE a gauge\nb 1\n", "not a sample of"),
        ("# TYPE a gauge\na{k=\"v} 1\n", "not closed"),
        ("# TYPE a gauge\na one\n", "invalid value"),
        (
            "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 0\n",
            "cumulative",
        ),
        (
            "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 1\nh_sum 0\n",
            "_count differs",
        ),
    ] {
        let err = parse(bad).unwrap_err();
        assert!(err.contains(why), "{bad:?}: {err}");
    }
}

#[test]
fn instruments_by_kind_are_made_once() {
    let by = ByKind::new(Counter::default);
    by.of("echo").inc();
    by.of("echo").inc();
    by.of("sleep").inc();
    let all: Vec<_> = by.all().into_iter().map(|(k, c)| (k, c.get())).collect();
    assert_eq!(all, vec![("echo".to_string(), 2), ("sleep".to_string(), 1)]);
}

#[test]
fn numbers_are_written_as_the_format_spells_them() {
    assert_eq!(number(3.0), "3");
    assert_eq!(number(0.25), "0.25");
    assert_eq!(number(f64::INFINITY), "+Inf");
    assert_eq!(number(f64::NAN), "NaN");
}

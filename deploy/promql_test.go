package deploy

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// A small PromQL reader: enough to find the series a query selects, the
// labels its selectors match on and the labels it groups by, so the
// dashboard can be checked against the expected metric set without the
// Prometheus module.

// selector is one vector selector: a metric name and its matchers' labels.
type selector struct {
	name   string
	labels []string
}

// promQuery is what a query refers to.
type promQuery struct {
	selectors []selector
	grouping  []string // labels in by, without, on, ignoring, group_left, group_right
	functions []string
	jobs      []string // the values of job="..." matchers
}

// PromQL's functions and aggregation operators (a call: a name then "(").
var promFunctions = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`
		abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes clamp
		clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year days_in_month deg
		delta deriv exp floor histogram_avg histogram_count histogram_fraction histogram_quantile
		histogram_stddev histogram_stdvar histogram_sum double_exponential_smoothing holt_winters hour idelta
		increase irate label_join label_replace last_over_time ln log10 log2 mad_over_time max_over_time
		min_over_time minute month pi predict_linear present_over_time quantile_over_time rad rate resets
		round scalar sgn sin sinh sort sort_by_label sort_by_label_desc sort_desc sqrt stddev_over_time
		stdvar_over_time sum_over_time tan tanh time timestamp vector year info
		sum avg count min max group stddev stdvar topk bottomk quantile count_values limitk limit_ratio`) {
		promFunctions[f] = true
	}
}

var (
	promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"atan2": true, "inf": true, "nan": true, "start": true, "end": true}
	promGrouping = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true,
		"group_left": true, "group_right": true}
	grafanaVar = regexp.MustCompile(`\$\{?__[a-z_]+\}?`)
)

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdentChar(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

// parsePromQL reads expr, with Grafana's $__interval-style variables
// standing for a duration.
func parsePromQL(expr string) (promQuery, error) {
	s := grafanaVar.ReplaceAllString(expr, "5m")
	var q promQuery
	i := 0
	skipSpace := func() {
		for i < len(s) && strings.ContainsRune(" \t\r\n", rune(s[i])) {
			i++
		}
	}
	readString := func() (string, error) {
		quote := s[i]
		i++
		var b strings.Builder
		for i < len(s) && s[i] != quote {
			if s[i] == '\\' && quote != '`' && i+1 < len(s) {
				i++
			}
			b.WriteByte(s[i])
			i++
		}
		if i >= len(s) {
			return "", fmt.Errorf("unterminated string in %q", expr)
		}
		i++
		return b.String(), nil
	}
	readIdent := func() string {
		j := i
		for i < len(s) && isIdentChar(s[i]) {
			i++
		}
		return s[j:i]
	}
	// readMatchers reads {label op "value", ...}; it returns the labels and
	// the metric name an __name__="..." matcher gives.
	readMatchers := func() ([]string, string, error) {
		i++ // {
		var labels []string
		name := ""
		for {
			skipSpace()
			if i >= len(s) {
				return nil, "", fmt.Errorf("unterminated {} in %q", expr)
			}
			if s[i] == '}' {
				i++
				return labels, name, nil
			}
			if s[i] == ',' {
				i++
				continue
			}
			if !isIdentStart(s[i]) {
				return nil, "", fmt.Errorf("bad label matcher at %q in %q", s[i:], expr)
			}
			label := readIdent()
			skipSpace()
			j := i
			for i < len(s) && strings.ContainsRune("=!~", rune(s[i])) {
				i++
			}
			op := s[j:i]
			if !slices.Contains([]string{"=", "!=", "=~", "!~"}, op) {
				return nil, "", fmt.Errorf("bad matcher operator %q in %q", op, expr)
			}
			skipSpace()
			if i >= len(s) || !strings.ContainsRune("\"'`", rune(s[i])) {
				return nil, "", fmt.Errorf("matcher %s%s wants a string in %q", label, op, expr)
			}
			v, err := readString()
			if err != nil {
				return nil, "", err
			}
			if label == "__name__" {
				if op == "=" {
					name = v
				}
				continue
			}
			if label == "job" && op == "=" {
				q.jobs = append(q.jobs, v)
			}
			if op[len(op)-1] == '~' {
				if _, err := regexp.Compile(v); err != nil {
					return nil, "", fmt.Errorf("matcher %s%s%q: %v", label, op, v, err)
				}
			}
			labels = append(labels, label)
		}
	}
	readLabelList := func() ([]string, error) {
		i++ // (
		var labels []string
		for {
			skipSpace()
			switch {
			case i >= len(s):
				return nil, fmt.Errorf("unterminated label list in %q", expr)
			case s[i] == ')':
				i++
				return labels, nil
			case s[i] == ',':
				i++
			case isIdentStart(s[i]):
				labels = append(labels, readIdent())
			default:
				return nil, fmt.Errorf("bad label list at %q in %q", s[i:], expr)
			}
		}
	}
	depth := 0
	for {
		skipSpace()
		if i >= len(s) {
			break
		}
		c := s[i]
		switch {
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			if _, err := readString(); err != nil {
				return q, err
			}
		case c == '{':
			labels, name, err := readMatchers()
			if err != nil {
				return q, err
			}
			if name == "" {
				return q, fmt.Errorf("a selector without a metric name in %q", expr)
			}
			q.selectors = append(q.selectors, selector{name, labels})
		case c == '[':
			for i < len(s) && s[i] != ']' {
				i++
			}
			i++
		case c == '(':
			depth++
			i++
		case c == ')':
			depth--
			i++
			if depth < 0 {
				return q, fmt.Errorf("unbalanced ) in %q", expr)
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(s) && (isIdentChar(s[i]) || s[i] == '.') {
				i++
			}
		case isIdentStart(c):
			id := readIdent()
			skipSpace()
			next := byte(0)
			if i < len(s) {
				next = s[i]
			}
			switch {
			case promGrouping[id]:
				if next == '(' {
					labels, err := readLabelList()
					if err != nil {
						return q, err
					}
					q.grouping = append(q.grouping, labels...)
				}
			case promKeywords[id]:
			case promFunctions[id] && (strings.HasPrefix(s[i:], "by") || strings.HasPrefix(s[i:], "without")):
				// An aggregation with its grouping first: sum by (x) (...).
				q.functions = append(q.functions, id)
			case next == '(':
				if !promFunctions[id] {
					return q, fmt.Errorf("unknown function %s in %q", id, expr)
				}
				q.functions = append(q.functions, id)
			default:
				sel := selector{name: id}
				if next == '{' {
					labels, name, err := readMatchers()
					if err != nil {
						return q, err
					}
					if name != "" {
						return q, fmt.Errorf("%s has a __name__ matcher too in %q", id, expr)
					}
					sel.labels = labels
				}
				q.selectors = append(q.selectors, sel)
			}
		default:
			i++ // an operator
		}
	}
	if depth != 0 {
		return q, fmt.Errorf("unbalanced ( in %q", expr)
	}
	return q, nil
}

func TestParsePromQL(t *testing.T) {
	for _, tc := range []struct {
		expr      string
		selectors []selector
		grouping  []string
	}{
		{`up`, []selector{{"up", nil}}, nil},
		{`sum by (code) (rate(x_total{code!~"(?i)ok", job="a"}[$__rate_interval]))`,
			[]selector{{"x_total", []string{"code", "job"}}}, []string{"code"}},
		{`histogram_quantile(0.99, sum by (le, bucket) (rate(h_bucket[5m])))`,
			[]selector{{"h_bucket", nil}}, []string{"le", "bucket"}},
		{`sum(rate(a_sum[1m])) / on (job) group_left(lane) sum(rate(a_count[1m]))`,
			[]selector{{"a_sum", nil}, {"a_count", nil}}, []string{"job", "lane"}},
		{`{__name__="g", lane="3"} > bool 0.5 offset 5m`, []selector{{"g", []string{"lane"}}}, nil},
		{`sum without (instance) (g) and max(h) # trailing comment`,
			[]selector{{"g", nil}, {"h", nil}}, []string{"instance"}},
		{`1e3 * x:rule:rate5m`, []selector{{"x:rule:rate5m", nil}}, nil},
	} {
		q, err := parsePromQL(tc.expr)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		if fmt.Sprint(q.selectors) != fmt.Sprint(tc.selectors) || fmt.Sprint(q.grouping) != fmt.Sprint(tc.grouping) {
			t.Errorf("%s: selectors %v grouping %v; want %v %v", tc.expr, q.selectors, q.grouping, tc.selectors, tc.grouping)
		}
	}
	for _, bad := range []string{
		`sum(rate(x[5m])`,
		`rat(x[5m])`,
		`x{code=ok}`,
		`x{code=~"("}`,
		`{job="a"}`,
		`x{code="ok"`,
	} {
		if _, err := parsePromQL(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

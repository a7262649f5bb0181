package control

import "testing"

// TestSemver: every version telemetry.Version can report becomes one that
// NATS micro accepts, keeping what it can of it.
func TestSemver(t *testing.T) {
	for in, want := range map[string]string{
		"v1.2.3":                   "1.2.3",
		"1.2.3-rc.1":               "1.2.3-rc.1",
		"devel":                    "0.0.0-devel",
		"devel+0123456789ab":       "0.0.0-devel+0123456789ab",
		"devel+0123456789ab-dirty": "0.0.0-devel+0123456789ab-dirty",
		"dev":                      "0.0.0-dev",
		"":                         "0.0.0-dev",
		"v1.2.3-0.20260101-abcdef": "1.2.3-0.20260101-abcdef",
		"weird version!":           "0.0.0-weird-version-",
	} {
		got := semver(in)
		if got != want || !semverRE.MatchString(got) {
			t.Errorf("semver(%q) = %q, want %q (valid SemVer)", in, got, want)
		}
	}
}

package shm

import "testing"

func TestStatusString(t *testing.T) {
	for s, want := range map[Status]string{StatusOK: "ok", StatusCanceled: "canceled", StatusExpired: "expired",
		StatusInvalid: "invalid", StatusUnavailable: "unavailable", StatusInternal: "internal", StatusOverloaded: "overloaded",
		Status(42): "status(42)"} {
		if got := s.String(); got != want {
			t.Errorf("Status(%d).String() = %q, want %q", uint32(s), got, want)
		}
	}
}

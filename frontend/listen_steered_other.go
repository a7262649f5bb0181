//go:build !linux

package frontend

import (
	"errors"
	"net"
	"time"

	"github.com/recmesh/recmesh/frontend/steering"
)

// steered is unavailable off Linux: Options.Steering must stay off there.
type steered struct {
	mode   steering.Mode
	addr   net.Addr
	dir    string
	reason string
	group  interface{ Migrates() bool }
}

func bindSteered(string, string, string) (*steered, error) {
	return nil, errors.New("connection steering needs Linux; leave Steering off")
}
func (s *steered) listen() (net.Listener, error) { return nil, errors.ErrUnsupported }
func (s *steered) setReady(bool)                 {}
func (s *steered) retire()                       {}
func (s *steered) settle(time.Duration) bool     { return true }
func (s *steered) addInflight(int32)             {}
func (s *steered) sweep(<-chan struct{})         {}
func (s *steered) close()                        {}

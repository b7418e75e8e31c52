// Package verror is a stand-in for vcert's (see go.mod).
package verror

import "errors"

var (
	VcertError             = errors.New("vcert error")
	ServerError            = errors.New("server error")
	ServerUnavailableError = errors.New("server unavailable")
)

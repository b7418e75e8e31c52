// Package util is a stand-in for vcert's (see go.mod).
package util

import "net/http"

const IssuerHintAllIssuers = "ALL_ISSUERS"

type userAgent struct {
	next http.RoundTripper
	ua   string
}

func (u userAgent) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("User-Agent", u.ua)
	return u.next.RoundTrip(r)
}

// UserAgentRoundTripper sets the User-Agent header of every request.
func UserAgentRoundTripper(next http.RoundTripper, ua string) http.RoundTripper {
	return userAgent{next, ua}
}

// EqualUnsorted tells whether two slices hold the same strings, in any order.
func EqualUnsorted(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	count := map[string]int{}
	for _, s := range a {
		count[s]++
	}
	for _, s := range b {
		if count[s]--; count[s] < 0 {
			return false
		}
	}
	return true
}

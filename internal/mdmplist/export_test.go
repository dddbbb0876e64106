package mdmplist

// FastXML reads data with fastTokens alone: errNotFast-wrapped and
// scanner errors are returned, never retried with encoding/xml.
func FastXML(data []byte, lim Limits, keys ...string) (map[string]string, error) {
	s := &xmlScanner{d: newFastTokens(data), lim: lim.orDefaults(), keys: keys, out: map[string]string{}}
	if err := s.run(); err != nil {
		return nil, err
	}
	return s.out, nil
}

// SlowXML reads data with encoding/xml alone.
func SlowXML(data []byte, lim Limits, keys ...string) (map[string]string, error) {
	return scanXMLSlow(data, lim.orDefaults(), keys)
}

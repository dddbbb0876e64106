package mysql

// TwoTrips says whether s runs completions in two round trips (conntx.go).
func TwoTrips(s *Storage) bool { return s.twoTrips }

"""Profile rules of `/users/track`: parse the bodies, validate them, fold attributes, apply them."""

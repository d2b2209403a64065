from raygrpo.testing.fake_provider.service import main

main()

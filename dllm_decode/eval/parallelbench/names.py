"""Name lists for the clean-room Waiting Line generator.

Chosen and typed for this project (a mix of common given names and surnames from several
languages); they are not the released ParallelBench lists. Every entry is a single ASCII word
without quotes or commas, so a rendered list literal stays parseable by the graders.
"""

from __future__ import annotations

from typing import Final

# fmt: off
#: Given names; a full name is "<first> <last>".
FIRST_NAMES: Final[tuple[str, ...]] = (
    "Aaron", "Abigail", "Adam", "Adrian", "Aisha", "Alberto", "Alex", "Alice", "Amara", "Amelia",
    "Andre", "Angela", "Anika", "Anna", "Arjun", "Ava", "Beatrice", "Ben", "Bianca", "Boris",
    "Brian", "Bruno", "Caleb", "Camila", "Carl", "Carmen", "Caroline", "Chen", "Chloe", "Clara",
    "Colin", "Connor", "Dalia", "Daniel", "Dara", "David", "Diana", "Diego", "Dmitri", "Dylan",
    "Edgar", "Elena", "Eli", "Elise", "Emil", "Emma", "Erik", "Esther", "Ethan", "Eva",
    "Fatima", "Felix", "Fiona", "Frances", "Gabriel", "Gemma", "George", "Gina", "Grace", "Hana",
    "Hannah", "Harvey", "Hector", "Helen", "Hugo", "Ian", "Ines", "Irene", "Isaac", "Ivan",
    "Jack", "Jade", "James", "Jasmine", "Javier", "Jenna", "Joel", "Jonas", "Julia", "Kai",
    "Karim", "Kate", "Kenji", "Laila", "Lara", "Leo", "Leon", "Liam", "Lina", "Lucas",
    "Lucy", "Luis", "Maya", "Marco", "Maria", "Martin", "Mateo", "Max", "Mei", "Mia",
    "Miguel", "Mila", "Nadia", "Naomi", "Nathan", "Nia", "Nico", "Nina", "Noah", "Nora",
    "Olga", "Oliver", "Omar", "Oscar", "Owen", "Pablo", "Paula", "Pedro", "Petra", "Priya",
    "Quentin", "Rafael", "Rania", "Raul", "Rebecca", "Rosa", "Ruby", "Ryan", "Sami", "Sara",
    "Sean", "Selma", "Simon", "Sofia", "Stella", "Tara", "Theo", "Tomas", "Uma", "Victor",
    "Vera", "Wade", "Wendy", "Xavier", "Yara", "Yusuf", "Zara", "Zoe", "Henrik", "Lotte",
)

#: Surnames.
LAST_NAMES: Final[tuple[str, ...]] = (
    "Abbott", "Acosta", "Adler", "Aguilar", "Ahmed", "Alvarez", "Andersen", "Archer", "Arnold",
    "Austin", "Bailey", "Baker", "Banks", "Barber", "Barker", "Bauer", "Becker", "Bell", "Bennett",
    "Berg", "Bishop", "Blake", "Bloom", "Bond", "Booth", "Bowen", "Boyle", "Brandt", "Brennan",
    "Briggs", "Brooks", "Bryant", "Burke", "Byrne", "Cabrera", "Caldwell", "Cameron", "Campos",
    "Carr", "Carter", "Castillo", "Chambers", "Chandler", "Chang", "Choi", "Clarke", "Cohen",
    "Cole", "Conway", "Cooper", "Cortez", "Crane", "Cruz", "Curtis", "Dalton", "Davies", "Dawson",
    "Delgado", "Dixon", "Doyle", "Drake", "Duarte", "Duncan", "Dunn", "Eaton", "Elliott", "Ellis",
    "Estrada", "Evans", "Farrell", "Fenwick", "Fleming", "Flores", "Fischer", "Ford", "Foster",
    "Fox", "Franco", "Frost", "Fuller", "Garcia", "Gardner", "Garner", "Gibson", "Gomez", "Graham",
    "Grant", "Graves", "Gupta", "Hale", "Hall", "Hansen", "Harper", "Hart", "Hayes", "Henderson",
    "Herrera", "Hill", "Hoffman", "Holland", "Holt", "Hopkins", "Howard", "Hughes", "Hunter",
    "Ibarra", "Ingram", "Iyer", "Jacobs", "Jensen", "Jordan", "Kaur", "Keller", "Kelly", "Khan",
    "Kim", "Klein", "Knight", "Koch", "Kowalski", "Kramer", "Lambert", "Lane", "Larsen", "Lawson",
    "Lee", "Lindqvist", "Little", "Lopez", "Lucas", "Lynch", "Mahler", "Mann", "Marsh", "Medina",
    "Mendoza", "Meyer", "Miles", "Molina", "Moreno", "Morris", "Murphy", "Nakamura", "Nash",
    "Navarro", "Nguyen", "Novak", "Nowak", "Oakley", "Okafor", "Olsen", "Ortega", "Osborne",
    "Owens", "Park", "Patel", "Pearson", "Perez", "Perry", "Pham", "Porter", "Price", "Quinn",
    "Ramirez", "Reed", "Reyes", "Rhodes", "Rivera", "Roberts", "Romero", "Ross", "Russo", "Saito",
    "Salazar", "Santos", "Schmidt", "Shah", "Sharp", "Silva", "Singh", "Sloan", "Soto", "Stone",
    "Strand", "Sutton", "Tanaka", "Taylor", "Torres", "Tran", "Tucker", "Vargas", "Vega", "Wagner",
    "Walsh", "Ward", "Watts", "Weber", "Wells", "West", "Wolfe", "Wong", "Young", "Zhang",
)
# fmt: on
